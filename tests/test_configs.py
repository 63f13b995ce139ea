"""The config table (kernels/configs.py): keys checked at import, and no row dead.

A row is dead when, at every shape class where it applies, each key it sets is set again by a later row that
applies there too (selection rule 4): it can be deleted without changing any config. `dead_rows` finds such
rows over a grid of shape classes whose widths, row counts and head dims sit on both sides of the table's
thresholds. Pure Python: no kernels run.
"""

import itertools
import re

import pytest

try:
    from samhq_fx.kernels import arch, configs
except ImportError:  # running from a checkout without the package installed
    from kernels import arch, configs

# fp32 / dot precision as the kernels pair them; head dims as the kernels see them (tiles.pad), `wide` following
# from d as rel_pos_attention derives it; key-grid widths and query-row counts on both sides of each threshold
PRECISIONS = [(False, "none"), (True, "tf32"), (True, "tf32x3")]
HEAD_DIMS = (64, 80, 128)
WIDTHS = (7, 8, 9, 14, 16, 17, 32, 33, 48, 64, 65, 128)
ROWS = (1, configs.ROWS_SMALL_FP32, configs.ROWS_SMALL_FP32 + 1, configs.ROWS_SMALL_16BIT,
        configs.ROWS_SMALL_16BIT + 1, 10**6)
# the GPU classes the rows tell apart: (shared memory a CTA may have, compute capability)
TARGETS = sorted({(a.smem, a.capability) for a in arch.ARCHS.values()})


def shape_classes():
    for (fp32, prec), wide, d, wk, rows, interpret, (smem, cc) in itertools.product(
            PRECISIONS, (True, False), HEAD_DIMS, WIDTHS, ROWS, (True, False), TARGETS):
        if wide == (d > configs.D_WIDE):
            yield dict(fp32=fp32, prec=prec, wide=wide, d=d, wk=wk, rows=rows, interpret=interpret, smem=smem, cc=cc)


def test_grid_covers_the_thresholds():
    assert {8192, 8193, 40000, 40001, 10**6} <= set(ROWS)
    assert {configs.WK_TINY, configs.WK_TINY + 1, configs.WK_NARROW, configs.WK_NARROW + 1, configs.WK_32,
            configs.WK_32 + 1, configs.WK_64, configs.WK_64 + 1} <= set(WIDTHS)
    assert {configs.D_64, configs.D_64 + 1} & set(HEAD_DIMS) and max(HEAD_DIMS) > configs.D_WIDE
    assert {configs.SMEM_99KB, configs.SMEM_163KB, configs.SMEM_HOPPER} == {smem for smem, _ in TARGETS}
    assert sum(1 for _ in shape_classes()) == 3 * 3 * len(WIDTHS) * 6 * 2 * len(TARGETS)


def dead_rows(table: list) -> list[int]:
    """Indices of the rows of `table` that never set a key surviving to a final config on the grid."""
    alive = set()
    for facts in shape_classes():
        for kernel in configs.KERNELS:
            applying = configs.applying_rows(kernel, facts, table)
            for n, i in enumerate(applying):
                later = set().union(*(table[j][2] for j in applying[n + 1:]))
                if set(table[i][2]) - later:
                    alive.add(i)
    return [i for i in range(len(table)) if i not in alive]


def test_no_row_is_shadowed():
    dead = dead_rows(configs.TABLE)
    assert not dead, [configs.TABLE[i] for i in dead]


def test_dead_row_check_finds_shadowed_and_unreachable_rows():
    why = "synthetic: 1 figure"
    table = [
        ("fwd", dict(fp32=False), dict(BLOCK_M=64, num_warps=4), why),  # alive: num_warps survives
        ("fwd", dict(fp32=False, max_wk=16), dict(BLOCK_M=32), why),  # dead: always replaced by the next row
        ("fwd", dict(fp32=False, max_wk=32), dict(BLOCK_M=16), why),
        ("dq", dict(fp32=True, prec="none"), dict(BLOCK_M=64), why),  # dead: fp32 never runs "none" dots
        ("dq", dict(wide=True, fp32=False), dict(BLOCK_M=64), why),  # alive: a GPU row for wide head dims
        ("dq", dict(fp32=False, min_d=129), dict(BLOCK_N=32), why),  # dead: no head dim above 128
        ("bwd", dict(), dict(FUSED=True), why),  # alive
        ("bwd", dict(interpret=True), dict(FUSED=False), why),  # alive: interpreter rows apply on their own
    ]
    configs.check_table(table)
    assert dead_rows(table) == [1, 3, 5]
    # a row that replaces only some of an earlier row's keys leaves it alive
    table[2] = ("fwd", dict(fp32=False, max_wk=32), dict(num_warps=8), why)
    assert dead_rows(table) == [3, 5]


def test_every_shape_class_gets_whole_blocks():
    for facts in shape_classes():
        for kernel in ("fwd", "dkdv", "dq"):
            cfg = configs.config(kernel, **facts)
            assert {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"} <= set(cfg), (kernel, facts, cfg)
        # no "bwd" row for wide head dims: rel_pos_attention reads FUSED with a default of False (split launches)
        assert set(configs.config("bwd", **facts)) <= {"FUSED"}, facts


@pytest.mark.parametrize("row,error", [
    (("fwd", dict(max_wkk=16), dict(BLOCK_N=32), "x: 1 figure"), "unknown condition key 'max_wkk'"),
    (("fwd", dict(fp32=1), dict(BLOCK_N=32), "x: 1 figure"), "condition fp32=1 is not a bool"),
    (("fwd", dict(prec="high"), dict(BLOCK_N=32), "x: 1 figure"), "unknown prec 'high'"),
    (("dq", dict(), dict(BIAS_T=True), "x: 1 figure"), "config keys ['BIAS_T'] are not 'dq' keys"),
    (("bwd", dict(), dict(BLOCK_M=16), "x: 1 figure"), "config keys ['BLOCK_M'] are not 'bwd' keys"),
    (("delta", dict(), dict(BLOCK_M=16), "x: 1 figure"), "unknown kernel 'delta'"),
    (("fwd", dict(), dict(), "x: 1 figure"), "sets no config key"),
    (("place", dict(), dict(INDUCTOR="False"), "x: 1 figure"), "config INDUCTOR='False' is not a bool"),
    (("fwd", dict(), dict(BLOCK_N=32), "measured earlier"), "one line of at most 110 characters with its figure"),
    (("fwd", dict(), dict(BLOCK_N=32), "1.2x\nfaster"), "one line of at most 110 characters with its figure"),
    (("fwd", dict(), dict(BLOCK_N=32), "1.2x faster " + "x" * 110), "one line of at most 110"),
])
def test_check_table_names_the_bad_row(row, error):
    good = configs.TABLE[0]
    with pytest.raises(ValueError, match=r"configs\.TABLE\[1\] .*" + re.escape(error)):
        configs.check_table([good, row])


def test_table_passes_its_own_check():
    configs.check_table(configs.TABLE)  # also run at import


def test_reasons_carry_no_commit_or_date():
    # where a row came from is git's history; the reason says what the row buys, with its figure
    for kernel, cond, cfg, why in configs.TABLE:
        assert not re.search(r"\b[0-9a-f]{7,40}\b", why), why
        assert not re.search(r"\d{4}-\d{2}-\d{2}", why), why
