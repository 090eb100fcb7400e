"""Config resolution: defaults < YAML < flags, coercion with the same checks as flags, strict keys."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from compress.core.config import check_range, load_yaml, resolve_config, to_dict
from compress.core.errors import UsageError
from compress.training.loop import TrainConfig


@dataclass(frozen=True)
class Toy:
    n: int = 3
    x: float = 0.5
    flag: bool = False
    names: tuple[str, ...] = ()
    path: str | None = None

    def __post_init__(self):
        check_range("x", self.x, 0, 1)


def test_precedence_defaults_then_file_then_flags():
    cfg = resolve_config(Toy, {"n": 5, "x": 0.25}, {"x": 0.75})
    assert (cfg.n, cfg.x, cfg.flag) == (5, 0.75, False)


@pytest.mark.parametrize("values, want", [
    ({"n": 2.0}, {"n": 2}),  # a YAML float that is a whole number
    ({"n": "7"}, {"n": 7}),
    ({"x": 1}, {"x": 1.0}),
    ({"names": "a,b"}, {"names": ("a", "b")}),
    ({"names": ["a", 3]}, {"names": ("a", "3")}),
    ({"path": None}, {"path": None}),
])
def test_coercion(values, want):
    cfg = resolve_config(Toy, values, {})
    assert {k: getattr(cfg, k) for k in want} == want


@pytest.mark.parametrize("values, needle", [
    ({"nn": 1}, "unknown option 'nn' in config file; valid options: flag, n, names, path, x"),
    ({"n": 2.5}, "option n: expected an integer, got 2.5"),
    ({"n": True}, "option n: expected a number, got True"),
    ({"n": float("inf")}, "option n: expected int, got inf"),
    ({"n": None}, "option n: expected int, got null"),
    ({"flag": "yes"}, "option flag: expected true or false, got 'yes'"),
    ({"x": float("nan")}, "--x must be in [0, 1], got nan"),
    ({"x": 2}, "--x must be in [0, 1], got 2"),
    ({"names": 5}, "option names: expected a list, got 5"),
    ({"n": {"a": 1}}, "option n: expected int"),
])
def test_bad_values_name_the_option(values, needle):
    with pytest.raises(UsageError) as e:
        resolve_config(Toy, values, {})
    assert needle in str(e.value)


def test_flags_get_the_same_checks_as_the_file():
    with pytest.raises(UsageError, match="unknown option 'zz' in flags"):
        resolve_config(Toy, {}, {"zz": 1})
    with pytest.raises(UsageError, match="--lr must be in"):
        resolve_config(TrainConfig, {}, {"lr": float("inf")})


@pytest.mark.parametrize("text, needle", [
    (b"a: [1, 2", "is not valid YAML"),
    (b"- 1\n- 2\n", "must hold a mapping of option: value, got list"),
    (b"\xff\xfe\x00bad", "is not valid YAML"),
    (b"!!python/object/apply:os.system ['touch /tmp/x']", "is not valid YAML"),  # safe loader refuses
])
def test_load_yaml_errors_name_the_file(tmp_path, text, needle):
    p = tmp_path / "c.yaml"
    p.write_bytes(text)
    with pytest.raises(UsageError) as e:
        load_yaml(p)
    assert needle in str(e.value) and str(p) in str(e.value)


def test_load_yaml_reads_dashes_as_underscores_and_empty_as_nothing(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("max-steps: 3\nlr: 0.1\n")
    assert load_yaml(p) == {"max_steps": 3, "lr": 0.1}
    p.write_text("")
    assert load_yaml(p) == {}
    with pytest.raises(UsageError, match="config file not found"):
        load_yaml(tmp_path / "missing.yaml")


def test_to_dict_round_trips_through_resolve():
    cfg = resolve_config(Toy, {"names": ["a"], "n": 9}, {})
    assert resolve_config(Toy, to_dict(cfg), {}) == cfg
