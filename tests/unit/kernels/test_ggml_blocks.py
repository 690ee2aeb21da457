"""The compiled packer (ggml blocks straight into int4 / int5 / int6 / int8g) against its oracle, the blocks decoded
into codes and scales and packed by `pack_int4*` / `pack_int5*` / `pack_int6` / `pack_int8g*`: the same bytes, for
every type the packer reads, alone and in the mixes a fused q/k/v or gate/up meets, with each part's rows in any
order and counts that leave a strip partly filled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from infer.engine.gguf.quants import EXACT_TYPES, Grouped, decode
from infer.engine.gguf.weights import block_plan, pack_grouped
from infer.kernels import BlockPlan, BlockRows, Int6Weight, Int8GroupWeight, PackedWeight, pack_ggml_blocks
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.tiny_gguf import random_blocks

T = GGMLQuantizationType
COLS = 512
MIXES = [
    (T.Q4_K, T.Q4_K, T.Q6_K),  # Qwen2.5 Q4_K_M's q, k, v: int8g, two-level, groups of 16 with minimums
    (T.Q5_0, T.Q5_0, T.Q8_0),  # Gemma 3 / Qwen2.5 0.5B: int8g, fp16 scales
    (T.Q4_0, T.Q4_1, T.Q4_K),  # int4 whose parts' scales are not all two-level: fp32
    (T.Q4_0, T.Q4_1),  # int4, fp16
    (T.Q5_0, T.Q5_0, T.Q4_0),  # Qwen2.5 0.5B's gate/up (and a 4-bit part): int5, fp16, Q5_0's codes + 16
    (T.Q5_K, T.Q4_K, T.Q5_K),  # Q5_K_M files: int5, two-level
    (T.Q5_1, T.Q4_K, T.Q5_0),  # int5, fp32
    (T.Q5_1, T.Q8_0, T.Q5_K),  # int8g groups of 32, fp32, minimums beside symmetric parts
    (T.Q2_K, T.Q3_K, T.Q5_K),  # int8g two-level, groups of 16, minimums beside a symmetric part
    (T.Q6_K, T.Q6_K),  # Q4_K_M files' Q6_K gate/up: int6, two-level
    (T.Q8_0, T.Q6_K),  # int8g groups of 16, fp32: each Q8_0 block read as two groups
    (T.Q6_K, T.Q8_0, T.Q4_0),  # the same with minimums (Q8_0's are zero)
]


@pytest.fixture(autouse=True)
def _compiled() -> None:
    require_compiled_kernels()


def _rows(g: Grouped, index: np.ndarray) -> Grouped:
    sup = None if g.super is None else g.super.rows(index)
    minimum = None if g.minimum is None else g.minimum[index]
    return Grouped(g.codes[index], g.scale[index], minimum, g.group, g.exact, sup)


def _both_ways(
    types: tuple[GGMLQuantizationType, ...], rows: tuple[int, ...], seed: int = 0, plan: BlockPlan | None = None
) -> tuple[PackedWeight, PackedWeight]:
    """(compiled, oracle) for parts of these types and row counts, each part's rows in a random order."""
    rng = np.random.default_rng(seed)
    blocks = [random_blocks(t, n, COLS, seed=seed + i) for i, (t, n) in enumerate(zip(types, rows, strict=True))]
    plan = plan or block_plan(types, COLS)
    orders = [rng.permutation(n) for n in rows]
    starts = np.cumsum((0, *rows))[:-1]
    order = np.concatenate([o + s for o, s in zip(orders, starts, strict=True)])
    compiled = pack_ggml_blocks([BlockRows(b, int(t)) for b, t in zip(blocks, types, strict=True)], order, COLS, plan)
    assert compiled is not None
    decoded = [_rows(decode(b, t, n, COLS), o) for b, t, n, o in zip(blocks, types, rows, orders, strict=True)]
    return compiled, pack_grouped(decoded, plan)


def _assert_same(compiled: PackedWeight, oracle: PackedWeight) -> None:
    assert type(compiled) is type(oracle)
    assert vars(compiled).keys() == vars(oracle).keys()
    for name, value in vars(oracle).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(vars(compiled)[name], value), name
        else:
            assert vars(compiled)[name] == value, name


@pytest.mark.parametrize("qtype", sorted(EXACT_TYPES, key=lambda t: t.name), ids=lambda t: t.name)
def test_each_type_packs_to_the_oracles_bytes(qtype: GGMLQuantizationType) -> None:
    _assert_same(*_both_ways((qtype,), (37,)))


@pytest.mark.parametrize("types", MIXES, ids=lambda ts: "+".join(t.name for t in ts))
def test_mixed_parts_pack_to_the_oracles_bytes(types: tuple[GGMLQuantizationType, ...]) -> None:
    _assert_same(*_both_ways(types, tuple(16 * (i + 1) + 3 * i for i in range(len(types))), seed=7))


def test_a_plan_may_store_fp16_values_as_fp32() -> None:
    plan = BlockPlan(codes="int4", group=32, scales="fp32", has_min=True)
    compiled, oracle = _both_ways((T.Q4_1,), (20,), plan=plan)
    _assert_same(compiled, oracle)
    assert compiled.packed.shape[2] == 384  # fp32 d and m: 256 bytes of nibbles + 2 x 16 x 4


def test_the_packed_weight_is_the_decoded_one() -> None:
    """Not only the oracle's bytes: the values the packed weight represents are the file's."""
    blocks = random_blocks(T.Q4_K, 24, COLS, seed=3)
    packed = pack_ggml_blocks([BlockRows(blocks, int(T.Q4_K))], np.arange(24), COLS, block_plan((T.Q4_K,), COLS))
    assert packed is not None
    assert torch.equal(packed.dequantize(), torch.from_numpy(decode(blocks, T.Q4_K, 24, COLS).dequantize()))


def test_q6_k_alone_packs_into_int6_and_beside_other_types_into_int8g() -> None:
    """int6 holds Q6_K's symmetric groups of 16 only: every part Q6_K, or the 8-bit groups as before."""
    assert block_plan((T.Q6_K, T.Q6_K), COLS) == BlockPlan("int6", 16, "two_level", has_min=False)
    for mix in [(T.Q4_K, T.Q4_K, T.Q6_K), (T.Q6_K, T.Q3_K), (T.Q6_K, T.Q8_0), (T.Q6_K, T.Q5_K)]:
        assert block_plan(mix, COLS).codes == "int8g", mix
    blocks = random_blocks(T.Q6_K, 21, COLS, seed=2)
    packed = pack_ggml_blocks([BlockRows(blocks, int(T.Q6_K))], np.arange(21), COLS, block_plan((T.Q6_K,), COLS))
    assert isinstance(packed, Int6Weight) and packed.packed.numel() == 2 * (COLS // 256) * 3360
    values = torch.from_numpy(decode(blocks, T.Q6_K, 21, COLS).dequantize())
    assert torch.equal(packed.dequantize().view(torch.int32), values.view(torch.int32))  # the file's, bit for bit
    mixed, _ = _both_ways((T.Q4_K, T.Q6_K), (16, 16))
    assert isinstance(mixed, Int8GroupWeight)


def test_an_int6_plan_takes_q6_k_only() -> None:
    int6 = BlockPlan("int6", 16, "two_level", has_min=False)
    for qtype, match in [(T.Q4_K, "minimums"), (T.Q3_K, "wider than 6 bits"), (T.Q8_0, "two-level")]:
        blocks = random_blocks(qtype, 16, COLS)
        with pytest.raises(ValueError, match=match):
            pack_ggml_blocks([BlockRows(blocks, int(qtype))], np.arange(16), COLS, int6)
    for plan in [("int6", 32, "two_level", False), ("int6", 16, "fp32", False), ("int6", 16, "two_level", True)]:
        with pytest.raises(ValueError, match="no packed format"):
            BlockPlan(*plan)  # type: ignore[arg-type]


def test_scales_a_plan_cannot_store_are_refused() -> None:
    blocks = random_blocks(T.Q4_0, 16, COLS)
    blocks[3, :2] = np.array([np.float16(60000.0)]).view(np.uint8)  # d fits fp16, m = -8 d does not
    fp16 = BlockPlan(codes="int4", group=32, scales="fp16", has_min=True)
    with pytest.raises(ValueError, match="fp16"):
        pack_ggml_blocks([BlockRows(blocks, int(T.Q4_0))], np.arange(16), COLS, fp16)
    blocks[5, :2] = np.array([np.float16(np.inf)]).view(np.uint8)
    fp32 = BlockPlan(codes="int4", group=32, scales="fp32", has_min=True)
    with pytest.raises(ValueError, match="not finite"):
        pack_ggml_blocks([BlockRows(blocks, int(T.Q4_0))], np.arange(16), COLS, fp32)


def test_blocks_that_do_not_fit_the_plan_are_refused() -> None:
    blocks = random_blocks(T.Q6_K, 16, COLS)
    with pytest.raises(ValueError, match="groups of 16 cannot be read at groups of 32"):
        pack_ggml_blocks([BlockRows(blocks, int(T.Q6_K))], np.arange(16), COLS, BlockPlan("int8g", 32, "fp32", False))
    with pytest.raises(ValueError, match="order out of range"):
        pack_ggml_blocks([BlockRows(blocks, int(T.Q6_K))], np.arange(17), COLS, block_plan((T.Q6_K,), COLS))
    q5 = random_blocks(T.Q5_0, 16, COLS)
    with pytest.raises(ValueError, match="wider than 4 bits"):
        pack_ggml_blocks([BlockRows(q5, int(T.Q5_0))], np.arange(16), COLS, BlockPlan("int4", 32, "fp32", True))


HUGE_PAGE = 2 << 20


def _mapping(address: int) -> tuple[int, list[str]]:
    """(start, VmFlags) of this process's mapping that holds `address` (/proc/self/smaps)."""
    start, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(a, 16) for a in head.split("-"))
            start, inside = low, low <= address < high
        elif inside and head == "VmFlags:":
            return start, line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize(("qtype", "rows"), [(T.Q8_0, 130), (T.Q8_0, 4100), (T.Q8_0, 62000), (T.Q5_0, 4100)], ids=str)
def test_int8g_and_int5_weights_are_packed_onto_huge_pages(qtype: GGMLQuantizationType, rows: int) -> None:
    """A decode step streams every weight: an int8g or int5 one (the kernels that stream at the memory's rate) of
    64 KiB or more lies in a 2 MiB-aligned map advised MADV_HUGEPAGE (VmFlags `hg`), a map of its own from
    32 MiB, so that transparent huge pages in `madvise` mode back it; the same bytes."""
    if rows < 10_000:
        compiled, oracle = _both_ways((qtype,), (rows,))  # int8g: 544 bytes a row; int5: 384
        _assert_same(compiled, oracle)
    else:
        blocks = random_blocks(qtype, rows, COLS)
        compiled = pack_ggml_blocks([BlockRows(blocks, int(qtype))], np.arange(rows), COLS, block_plan((qtype,), COLS))
        assert compiled is not None
        last = torch.from_numpy(decode(blocks[-1:], qtype, 1, COLS).dequantize())
        assert torch.equal(compiled.rows(torch.tensor([rows - 1])), last)
    packed = vars(compiled)["packed"]
    start, flags = _mapping(packed.data_ptr())
    assert start % HUGE_PAGE == 0
    if rows > 10_000:
        assert packed.data_ptr() == start
    if "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text():
        assert "hg" in flags
