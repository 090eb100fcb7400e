"""The named benchmarks: name -> module and one line. Listed here by hand (no discovery), in the
order of docs/results.md; an unknown name fails with this list."""

from __future__ import annotations

from benchmarks.suite import Benchmark

_DISTILL_SST2 = {"task": "sst2", "train_limit": 20000, "augment": 10, "epochs": 3, "max_length": 64,
                 "students": "bilstm,kimcnn,logreg", "teacher_epochs": 2.0, "teacher_lr": 5e-5}
_DISTILL_REUTERS = {"task": "reuters", "train_limit": None, "augment": 2, "epochs": 10, "max_length": 256,
                    "students": "bilstm,logreg", "teacher_epochs": 5.0, "teacher_lr": 1e-4}
_SQUAD_ONESHOT = {"task": "squad", "split_by_article": "38/10", "max_length": 256,
                  "cells": "oneshot,recovery",
                  "only": "sparsegpt-50,wanda-50,magnitude-50,sparsegpt-60,sparsegpt-2of4,sparsegpt-70"}

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("sweep-small", "sweep_small",
              "the reduced Gordon et al. sweep: magnitude vs random pruning in MLM pre-training, SST-2/RTE"),
    Benchmark("prune-kd-pairs", "prune_kd_pairs",
              "pruning while fine-tuning with and without --teacher self, paired by seed"),
    Benchmark("oneshot-post-training", "oneshot_post_training",
              "one-shot SparseGPT/Wanda/magnitude/Fisher-structured grid, with and without KD recovery"),
    Benchmark("squad-oneshot", "oneshot_post_training",
              "SQuAD: fine-tune MiniLM, then the one-shot grid on held-out articles (made for a GPU)",
              _SQUAD_ONESHOT),
    Benchmark("sparsegpt-cost", "sparsegpt_cost",
              "wall time and peak memory of one-shot SparseGPT on a random MiniLM/BERT-base shape"),
    Benchmark("speed-at-kept-accuracy", "speed_at_kept_accuracy",
              "int8 exports of a dense and pruned models with dev scores, benched against eager fp32"),
    Benchmark("structured-reconstruction", "structured_reconstruction",
              "speedup families: --criterion obs against fisher, one-shot and gradual, SST-2 and AG News"),
    Benchmark("family-seeds", "family_seeds",
              "mean ± spread over seeds of finished speedup families (METHOD-sSEED/family.json)"),
    Benchmark("speed-family", "speed_family",
              "latency table, one-shot and recovered --speedup families on SST-2, each step timed"),
    Benchmark("latency-table", "latency_table",
              "latency table predictions against whole pruned encoders timed on this machine"),
    Benchmark("family-rebench", "family_rebench",
              "a finished --speedup family exported again and benched in one run"),
    Benchmark("layerwise-recovery", "layerwise_recovery",
              "post-training recovery with and without --kd-layers, paired by seed"),
    Benchmark("distill-sst2", "distill_students",
              "SST-2: MiniLM teacher, then each student with KD and with --no-kd", _DISTILL_SST2),
    Benchmark("distill-reuters", "distill_students",
              "Reuters (multi-label): MiniLM teacher, then each student with KD and --no-kd",
              _DISTILL_REUTERS),
    Benchmark("distill-logreg-seeds", "distill_logreg_seeds",
              "KD vs --no-kd for the linear student over seeds, beside scikit-learn's LogisticRegression"),
    Benchmark("export-speed-accuracy", "export_speed_accuracy",
              "ONNX fp32/int8 exports, structured model and students against PyTorch fp32, with dev scores"),
    Benchmark("gpu-check", "gpu_check",
              "prepared check for a lent GPU: half-precision exports, PyTorch peers, 2:4 linears, gpu tests"),
    Benchmark("cpu-peers", "cpu_peers",
              "onnxruntime fp32/int8 against eager, torch.compile and PyTorch int8 on a CPU, one bench run"),
    Benchmark("qa-squad", "qa_squad",
              "SQuAD v1.1 split by article: fine-tune once per objective (plain, pfa, hl-aacl)"),
    Benchmark("reqa", "reqa",
              "ReQA on held-out SQuAD articles: BM25, zero-shot, dual encoder, mined pairs"),
    Benchmark("embedding-minilm", "embedding_minilm",
              "all-MiniLM-L6-v2 as an embedder: one-shot, structured + recovery, int8, static student"),
    Benchmark("static-model2vec", "static_model2vec",
              "the static student beside Model2Vec's default at 256 dims: ReQA, MRPC, sentences/s, size"),
)}
