"""One evaluation for PyTorch and onnxruntime: the same metric from the same batches, checked
against a hand-run loop over the examples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.export.inputs import declared_inputs
from compress.export.loading import LoadedModel
from compress.export.model_export import ort_accuracy
from compress.export.onnx import export_onnx
from compress.models.loading import load_classifier
from compress.tasks.task_data import TaskDataConfig, load_task_data
from compress.training.evaluation import evaluate, torch_logits_fn

pytestmark = pytest.mark.filterwarnings("ignore")


def test_torch_and_onnxruntime_are_scored_by_one_evaluation(tiny_bert, tmp_path):
    spec, data = load_task_data(TaskDataConfig(task="sample", eval_limit=24), ("eval",))
    ds = data["eval"]
    torch.manual_seed(0)
    model, tokenizer, _ = load_classifier(str(tiny_bert), tuple(ds.label_names))
    model.eval()

    # by hand: one example at a time, no padding
    want = []
    with torch.no_grad():
        for text in ds.texts:
            enc = tokenizer(text, truncation=True, max_length=32, return_tensors="pt")
            want.append(model(**enc).logits[0].numpy())
    want = np.stack(want)
    labels = np.array([y if isinstance(y, int) else y[0] for y in ds.labels])
    acc = float((want.argmax(-1) == labels).mean())

    got = evaluate(torch_logits_fn(model), tokenizer, spec, ds, 32, batch_size=5, with_logits=True)
    assert got["n"] == 24 and got["score"] == got["accuracy"] == pytest.approx(acc)
    np.testing.assert_allclose(got["logits"], want, atol=1e-5)  # padding to the batch changes nothing

    path = export_onnx(LoadedModel(model, declared_inputs(model), "bert"), tmp_path / "m.onnx")
    ort = ort_accuracy(path, tokenizer, spec, ds, 32, batch_size=7, with_logits=True)
    assert ort["accuracy"] == pytest.approx(acc) and ort["n"] == 24
    np.testing.assert_allclose(ort["logits"], want, atol=1e-4)
