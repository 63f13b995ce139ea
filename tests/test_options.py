"""The samhq backend's options: each bad value is a ValueError or TypeError that names the option (or environment
variable) and what it takes, raised by `samhq_fx.options` and `compile_encoder` before anything compiles, and by
plain torch.compile at the first call as that error, not inside Dynamo's BackendCompilerFailed."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch._dynamo.utils import counters

import samhq_fx
import samhq_fx.backend
from samhq_fx.options import Options, inductor_modes
from samhq_fx.recompute import RecomputeRelCopies

from helpers import fresh_compile_state

ENV_VARS = ("SAMHQ_FX_DISABLE", "SAMHQ_FX_DUMP_DIR", "SAMHQ_FX_MIN_SEQ_LEN", "SAMHQ_FX_TRITON_OP",
            "SAMHQ_FX_HOST_INDICES", "SAMHQ_FX_STATIC_LAUNCH", "SAMHQ_FX_MEMORY_BUDGET", "SAMHQ_FX_RECOMPUTE_COPIES")


@pytest.fixture(autouse=True)
def no_samhq_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def _bool_error(key, val):
    return TypeError, rf"options\['{key}'\] must be True or False, got {re.escape(repr(val))} \({type(val).__name__}\)"


BAD = [  # (options, error, message)
    ({"samhq.dumpdir": "d"}, ValueError, r"unknown option 'samhq.dumpdir'; did you mean 'samhq.dump_dir'\?"),
    ({"samhq.inductr": False}, ValueError, r"unknown option 'samhq.inductr'; did you mean 'samhq.inductor'\?"),
    ({"samhq.rewrite": "no"}, *_bool_error("samhq.rewrite", "no")),
    ({"samhq.rewrite": 0}, *_bool_error("samhq.rewrite", 0)),
    ({"samhq.host_indices": None}, *_bool_error("samhq.host_indices", None)),
    ({"samhq.inductor": "False"}, *_bool_error("samhq.inductor", "False")),
    ({"samhq.static_launch": 1}, *_bool_error("samhq.static_launch", 1)),
    ({"samhq.recompute_copies": "yes"}, *_bool_error("samhq.recompute_copies", "yes")),
    ({"samhq.min_seq_len": -1}, ValueError, r"options\['samhq.min_seq_len'\] must be an int >= 1, got -1"),
    ({"samhq.min_seq_len": 0}, ValueError, r"options\['samhq.min_seq_len'\] must be an int >= 1, got 0"),
    ({"samhq.min_seq_len": 2.0}, TypeError, r"options\['samhq.min_seq_len'\] must be an int >= 1, got 2.0 \(float\)"),
    ({"samhq.min_seq_len": True}, TypeError, r"options\['samhq.min_seq_len'\] must be an int >= 1, got True"),
    ({"samhq.min_seq_len": "8"}, TypeError, r"options\['samhq.min_seq_len'\] must be an int >= 1, got '8' \(str\)"),
    ({"samhq.dump_dir": 5}, TypeError,
     r"options\['samhq.dump_dir'\] must be None or a directory path \(str or os.PathLike\), got 5 \(int\)"),
    ({"samhq.dump_dir": b"d"}, TypeError, r"options\['samhq.dump_dir'\] must be None or a directory path"),
    ({"samhq.dump_dir": ""}, ValueError, r"options\['samhq.dump_dir'\] must be a directory path, got ''"),
    ({"samhq.triton_op": "yes"}, ValueError, r"options\['samhq.triton_op'\] must be True, False or 'auto', got 'yes'"),
    ({"samhq.triton_op": 1}, TypeError, r"options\['samhq.triton_op'\] must be True, False or 'auto', got 1"),
    ({"samhq.memory_budget": 0}, ValueError, r"options\['samhq.memory_budget'\] must be None or a number in \(0, 1\]"),
    ({"samhq.memory_budget": 1.5}, ValueError, r"options\['samhq.memory_budget'\] must be None or a number in \(0, 1\]"),
    ({"samhq.memory_budget": float("nan")}, ValueError, r"options\['samhq.memory_budget'\] must be .* got nan"),
    ({"samhq.memory_budget": "half"}, TypeError, r"options\['samhq.memory_budget'\] must be None or a number"),
    ({"samhq.memory_budget": True}, TypeError, r"options\['samhq.memory_budget'\] must be None or a number"),
    ({"samhq.mode": "fast"}, ValueError, r"options\['samhq.mode'\]='fast' is not an Inductor mode; valid: default"),
    ({"samhq.mode": 3}, TypeError, r"options\['samhq.mode'\] must be None or one of the Inductor modes"),
    ({"max_autotun": True}, ValueError, r"unknown option 'max_autotun': neither a samhq option \(samhq.\*\) nor an "
                                        r"Inductor config option .*; did you mean 'max_autotune'\?"),
    ({"triton.cudagraph": True}, ValueError, r"unknown option 'triton.cudagraph'.*did you mean 'triton.cudagraphs'\?"),
    ({"dump_dir": "d"}, ValueError, r"unknown option 'dump_dir'.*did you mean 'samhq.dump_dir'\?"),
    ({1: True}, TypeError, r"option names must be str, got 1 \(int\)"),
    ({"samhq.mode": "reduce-overhead", "triton.cudagraphs": False}, ValueError,
     r"mode 'reduce-overhead' sets 'triton.cudagraphs'=True, options set it to False"),
    ({"samhq.mode": "max-autotune", "samhq.inductor": False}, ValueError, r"mode 'max-autotune' is an Inductor mode, and options\['samhq.inductor'\] is False"),
    ({"pre_grad_custom_pass": lambda g: None}, ValueError, r"options\['pre_grad_custom_pass'\] is taken by the samhq"),
    ({"joint_custom_post_pass": lambda g: None, "samhq.recompute_copies": True}, ValueError,
     r"options\['joint_custom_post_pass'\] is taken by samhq.recompute_copies \(options\['samhq.recompute_copies'\] "
     r"or SAMHQ_FX_RECOMPUTE_COPIES=1\); turn that off"),
]


@pytest.mark.parametrize("opts,error,message", BAD)
def test_bad_option_names_itself(opts, error, message):
    with pytest.raises(error, match="^samhq backend: " + message) as info:
        Options.resolve(opts)
    assert info.type is error
    with pytest.raises(error, match=message):
        samhq_fx.options(opts)


def test_options_must_be_a_mapping():
    with pytest.raises(TypeError, match=r"options must be a mapping \(a dict of option names to values\), got list"):
        Options.resolve(["samhq.inductor"])
    with pytest.raises(TypeError, match="positional argument must be a mapping .* got list"):
        samhq_fx.options(["samhq.inductor"])


def test_dump_dir_must_not_be_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"options\['samhq.dump_dir'\]='.*f' is a file; it must be a directory"):
        samhq_fx.options(dump_dir=tmp_path / "f")
    assert samhq_fx.options(dump_dir=tmp_path / "new" / "dir") == {"samhq.dump_dir": str(tmp_path / "new" / "dir")}


def test_keywords_are_samhq_options_only():
    with pytest.raises(TypeError, match=r"unknown option dumpdir=; did you mean dump_dir=\?"):
        samhq_fx.options(dumpdir="d")
    with pytest.raises(TypeError, match=r"unknown option max_autotune=.*Inductor options go in the mapping"):
        samhq_fx.options(max_autotune=True)
    with pytest.raises(TypeError, match=r"options\['samhq.rewrite'\] must be True or False, got 'no'"):
        samhq_fx.options(rewrite="no")
    with pytest.raises(ValueError, match=r"'samhq.rewrite' is given twice, in the mapping and as rewrite="):
        samhq_fx.options({"samhq.rewrite": True}, rewrite=False)


def test_options_round_trip(tmp_path):
    got = samhq_fx.options({"epilogue_fusion": False}, mode="max-autotune-no-cudagraphs", rewrite=True,
                           dump_dir=tmp_path / "d", min_seq_len=4, triton_op=False, host_indices=False,
                           inductor=True, static_launch=False, memory_budget=1, recompute_copies=True)
    assert type(got) is dict
    assert got == {"epilogue_fusion": False, "samhq.mode": "max-autotune-no-cudagraphs", "samhq.rewrite": True,
                   "samhq.dump_dir": str(tmp_path / "d"), "samhq.min_seq_len": 4, "samhq.triton_op": False,
                   "samhq.host_indices": False, "samhq.inductor": True, "samhq.static_launch": False,
                   "samhq.memory_budget": 1.0, "samhq.recompute_copies": True}
    assert isinstance(got["samhq.memory_budget"], float) and isinstance(got["samhq.dump_dir"], str)
    assert samhq_fx.options(got) == got  # already checked: unchanged
    resolved = Options.resolve(got)
    assert resolved == Options(mode="max-autotune-no-cudagraphs", rewrite=True, dump_dir=str(tmp_path / "d"),
                               min_seq_len=4, triton_op=False, host_indices=False, inductor=True,
                               static_launch=False, memory_budget=1.0, recompute_copies=True,
                               inductor_options={"epilogue_fusion": False})
    assert resolved.inductor_patches() == {**inductor_modes()["max-autotune-no-cudagraphs"], "epilogue_fusion": False}
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.rewrite = False
    assert samhq_fx.options() == {} and Options.resolve(None) == Options() == Options.resolve({})
    assert samhq_fx.options(triton_op="auto", dump_dir=None) == {"samhq.triton_op": "auto", "samhq.dump_dir": None}
    # torch.compile's own keys go through options() to torch.compile, which takes them out; they are not Inductor's
    guard = {"guard_filter_fn": lambda entries: [False] * len(entries)}
    assert samhq_fx.options(guard) == guard and Options.resolve(guard).inductor_options == {}
    # torch.compile's mode= and samhq.mode: either, or both when they agree
    assert Options.resolve(None, mode="reduce-overhead").mode == "reduce-overhead"
    assert Options.resolve({"samhq.mode": "max-autotune"}, mode="max-autotune").mode == "max-autotune"
    with pytest.raises(ValueError, match=r"mode='max-autotune' and options\['samhq.mode'\]='reduce-overhead' differ"):
        Options.resolve({"samhq.mode": "reduce-overhead"}, mode="max-autotune")


ENV_BAD = [  # (variable, value, what it must be)
    ("SAMHQ_FX_DISABLE", "yes", "0 or 1"),
    ("SAMHQ_FX_DISABLE", "true", "0 or 1"),
    ("SAMHQ_FX_HOST_INDICES", "on", "0 or 1"),
    ("SAMHQ_FX_STATIC_LAUNCH", "2", "0 or 1"),
    ("SAMHQ_FX_RECOMPUTE_COPIES", "yes", "0 or 1"),
    ("SAMHQ_FX_TRITON_OP", "yes", "0, 1 or auto"),
    ("SAMHQ_FX_MIN_SEQ_LEN", "abc", "an integer >= 1"),
    ("SAMHQ_FX_MIN_SEQ_LEN", "0", "an integer >= 1"),
    ("SAMHQ_FX_MIN_SEQ_LEN", "2.5", "an integer >= 1"),
    ("SAMHQ_FX_MEMORY_BUDGET", "low", "a number in (0, 1]"),
    ("SAMHQ_FX_MEMORY_BUDGET", "0", "a number in (0, 1]"),
    ("SAMHQ_FX_MEMORY_BUDGET", "1.5", "a number in (0, 1]"),
    ("SAMHQ_FX_MEMORY_BUDGET", "nan", "a number in (0, 1]"),
]


@pytest.mark.parametrize("var,val,expected", ENV_BAD)
def test_bad_env_var_names_itself(monkeypatch, var, val, expected):
    monkeypatch.setenv(var, val)
    message = re.escape(f"samhq backend: {var} must be {expected}, got {val!r}")
    with pytest.raises(ValueError, match=message):
        Options.resolve(None)
    with pytest.raises(ValueError, match=message):
        samhq_fx.options(rewrite=True)  # a bad variable is an error even where an option overrides it
    with pytest.raises(ValueError, match=message):
        Options.resolve(None, env={var: val})  # an explicit environment, as given


def test_env_dump_dir_must_not_be_a_file(monkeypatch, tmp_path):
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("SAMHQ_FX_DUMP_DIR", str(tmp_path / "f"))
    with pytest.raises(ValueError, match="SAMHQ_FX_DUMP_DIR='.*f' is a file"):
        Options.resolve(None)


def test_env_vars_set_options_and_options_win(monkeypatch):
    env = {"SAMHQ_FX_DISABLE": "1", "SAMHQ_FX_DUMP_DIR": "dumps", "SAMHQ_FX_MIN_SEQ_LEN": "16",
           "SAMHQ_FX_TRITON_OP": "1", "SAMHQ_FX_HOST_INDICES": "0", "SAMHQ_FX_STATIC_LAUNCH": "0",
           "SAMHQ_FX_MEMORY_BUDGET": "0.25", "SAMHQ_FX_RECOMPUTE_COPIES": "1"}
    for var, val in env.items():
        monkeypatch.setenv(var, val)
    want = Options(rewrite=False, dump_dir="dumps", min_seq_len=16, triton_op=True, host_indices=False,
                   static_launch=False, memory_budget=0.25, recompute_copies=True)
    assert Options.resolve(None) == want == Options.resolve(None, env=env)
    given = {"samhq.rewrite": True, "samhq.dump_dir": None, "samhq.min_seq_len": 2, "samhq.triton_op": "auto",
             "samhq.host_indices": True, "samhq.static_launch": True, "samhq.memory_budget": None,
             "samhq.recompute_copies": False}
    assert Options.resolve(given) == Options(min_seq_len=2)
    assert samhq_fx.options(min_seq_len=2) == {"samhq.min_seq_len": 2}  # the variables still apply to the rest
    assert Options.resolve(None, env={"SAMHQ_FX_DISABLE": "0", "SAMHQ_FX_TRITON_OP": "auto"}) == Options()
    assert Options.resolve(None, env={"SAMHQ_FX_TRITON_OP": "0", "SAMHQ_FX_HOST_INDICES": "1"}) == Options(
        triton_op=False)
    assert Options.resolve(None, env={var: "" for var in ENV_VARS}) == Options()  # "": unset


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).softmax(-1)


class _Holder(torch.nn.Module):
    """Stands in for a SamModel: compile_encoder compiles its `vision_encoder`."""

    def __init__(self):
        super().__init__()
        self.vision_encoder = _Encoder()

    def forward(self, x):
        return self.vision_encoder(x) + 1


def test_compile_encoder_checks_options_before_compiling(monkeypatch):
    compiled = []
    real_compile = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compiled.append(kw) or real_compile(self, **kw))
    fresh_compile_state()
    model = _Holder()
    x = torch.randn(2, 4)
    for opts, error, message in [({"samhq.dumpdir": "d"}, ValueError, "did you mean 'samhq.dump_dir'"),
                                 ({"samhq.rewrite": "no"}, TypeError, r"options\['samhq.rewrite'\] must be True"),
                                 ({"samhq.min_seq_len": -1}, ValueError, r"options\['samhq.min_seq_len'\] must be"),
                                 ({"samhq.dump_dir": 5}, TypeError, r"options\['samhq.dump_dir'\] must be None or")]:
        with pytest.raises(error, match=message):
            samhq_fx.compile_encoder(model, options=opts)
    with pytest.raises(ValueError, match="`options` must be a dict"):
        samhq_fx.compile_encoder(model, options=["samhq.inductor"])
    with pytest.raises(ValueError, match="mode='turbo' is not an Inductor mode"):
        samhq_fx.compile_encoder(model, mode="turbo")
    monkeypatch.setenv("SAMHQ_FX_MIN_SEQ_LEN", "abc")
    with pytest.raises(ValueError, match="SAMHQ_FX_MIN_SEQ_LEN must be an integer >= 1"):
        samhq_fx.compile_encoder(model)
    with pytest.raises(ValueError, match="SAMHQ_FX_MIN_SEQ_LEN must be an integer >= 1"):
        samhq_fx.SamHQCompileCallback(options={"samhq.inductor": False})
    monkeypatch.delenv("SAMHQ_FX_MIN_SEQ_LEN")
    ref = model(x)
    assert compiled == [] and model.vision_encoder._compiled_call_impl is None
    assert counters["frames"]["total"] == 0  # Dynamo compiled nothing
    # the same model with good options compiles, at its first call
    samhq_fx.compile_encoder(model, options=samhq_fx.options(inductor=False, min_seq_len=2))
    assert compiled == [{"backend": "samhq", "options": {"samhq.inductor": False, "samhq.min_seq_len": 2}}]
    torch.testing.assert_close(model(x), ref)
    assert counters["frames"]["ok"] >= 1 and counters["samhq"]["graphs"] == 1


@pytest.mark.parametrize("opts,error,message", [
    ({"samhq.rewrite": "no"}, TypeError, "samhq backend: options['samhq.rewrite'] must be True or False, got 'no' (str)"),
    ({"samhq.min_seq_len": -1}, ValueError, "samhq backend: options['samhq.min_seq_len'] must be an int >= 1, got -1"),
    (["samhq.inductor"], TypeError,
     "samhq backend: options must be a mapping (a dict of option names to values), got list"),
])
def test_plain_torch_compile_raises_the_option_error_at_the_first_call(opts, error, message):
    # torch.compile gives a backend named by a string no call before the first graph (_TorchCompileWrapper), so the
    # check runs there; the caller gets the ValueError / TypeError and its message, not BackendCompilerFailed's
    fresh_compile_state()
    f = torch.compile(lambda x: x + 1, backend="samhq", options=opts)
    with pytest.raises(error) as info:
        f(torch.ones(2))
    assert str(info.value) == message
    assert not isinstance(info.value, torch._dynamo.exc.BackendCompilerFailed)
    with pytest.raises(error):  # not cached as a success or an eager fallback
        f(torch.ones(2))
    assert counters["samhq"]["graphs"] == 0


def test_checked_options_drive_torch_compile(tmp_path):
    fresh_compile_state()
    f = torch.compile(lambda x: x.softmax(-1) + 1, backend="samhq",
                      options=samhq_fx.options(dump_dir=tmp_path / "dumps", inductor=False))
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), x.softmax(-1) + 1)
    assert counters["samhq"]["graphs"] == 1 and (tmp_path / "dumps" / "graph_1_report.txt").exists()


def test_backend_hands_the_resolved_fields_to_the_passes(monkeypatch, tmp_path):
    import torch._inductor.compile_fx

    seen, budgets, moved = {}, [], []
    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx",
                        lambda gm, example_inputs, config_patches=None: seen.update(config_patches) or gm.forward)
    real_budget = samhq_fx.backend.memory_budget
    monkeypatch.setattr(samhq_fx.backend, "memory_budget", lambda b: budgets.append(b) or real_budget(b))
    monkeypatch.setattr(samhq_fx.backend, "move_host_indices", lambda graph: moved.append(graph))
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    opts = samhq_fx.options({"epilogue_fusion": False}, min_seq_len=7, dump_dir=tmp_path, triton_op=True,
                            memory_budget=0.5, host_indices=False, static_launch=False)
    samhq_fx.backend.samhq_backend(gm, [torch.ones(2)], options=opts)
    rewrite = seen.pop("pre_grad_custom_pass")
    assert (rewrite.min_seq_len, rewrite.dump_dir, rewrite.triton_op) == (7, str(tmp_path), True)
    assert seen == {"epilogue_fusion": False} and budgets == [0.5] and moved == []
    samhq_fx.backend.samhq_backend(gm, [torch.ones(2)], mode="max-autotune-no-cudagraphs")
    assert seen["max_autotune"] is True and len(moved) == 1 and budgets == [0.5, None]
    assert seen["pre_grad_custom_pass"].triton_op == "auto"
    assert "joint_custom_post_pass" not in seen  # samhq.recompute_copies is off by default
    seen.clear()
    samhq_fx.backend.samhq_backend(gm, [torch.ones(2)], options=samhq_fx.options(recompute_copies=True))
    assert isinstance(seen["joint_custom_post_pass"], RecomputeRelCopies)
    assert seen["pre_grad_custom_pass"].triton_op == "auto"
