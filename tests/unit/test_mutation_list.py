"""scripts/check_mutations.py's list stays current: each mutation's old text is in its file exactly
once, its replacement differs, and the tests it names exist (the script itself runs them)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("check_mutations", ROOT / "scripts" / "check_mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclass looks its module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_every_mutation_applies_once_and_names_existing_tests():
    script = _script()
    names = [m.name for m in script.MUTATIONS]
    assert len(set(names)) == len(names)
    for m in script.MUTATIONS:
        assert (ROOT / m.file).read_text(encoding="utf-8").count(m.old) == 1, m.name
        assert m.new != m.old and m.tests, m.name
        for node in m.tests:
            path, _, test = node.partition("::")
            assert re.search(rf"^def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), node


def test_only_picks_a_mutation_by_number_or_its_lettered_variants():
    script = _script()
    assert script._selects("9", "9c option loss") and script._selects("9c", "9c option loss")
    assert not script._selects("9", "10a full head count") and not script._selects("1", "11a scale bound")
    assert script._selects("stock", "3 stock-copy output check skipped")
