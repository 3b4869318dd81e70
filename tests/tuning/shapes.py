"""What the tuning tests share: the presets, one shape per tunable kind, a sampled trace."""

from __future__ import annotations

from tvm import s_tir

from dsa_tvm.hw.config import load_config
from dsa_tvm.tuning import Task
from tir_schedules.kinds.conv2d import ConvShape
from tir_schedules.kinds.eltwise import EltwiseShape
from tir_schedules.kinds.global_pool import GlobalSumShape
from tir_schedules.kinds.grouped_dense import GroupedShape
from tir_schedules.kinds.matmul import MatmulShape
from tir_schedules.kinds.space import sample_knobs
from tir_schedules.kinds.window import WindowShape

DEFAULT = load_config("default")
EDGE = load_config("edge")


def conv_shape(h=14, icb=4, ocb=4, k=3, cfg=DEFAULT, **kw) -> ConvShape:
    b = cfg.block_in
    return ConvShape(1, h, h, icb, ocb, k, k, (1, 1), (k // 2,) * 4, (1, 1), b, b, 0, 0,
                     (-128, 127), **kw)


SHAPES = {
    "conv": conv_shape(),
    "window": WindowShape("max", 1, 12, 12, 2, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 16, -128, 0,
                          (-128, 127)),
    "global_sum": GlobalSumShape(1, 49, 4, 16, 0, (-128, 127)),
    "eltwise": EltwiseShape("add", 36, 3, 16, 0, (-128, 127), 1, 1),
    "matmul": MatmulShape(2, 12, 2, 3, 16, 16, 0, (-128, 127)),
    # attention's P @ V on byte planes: 2 x 6 GEMM rows, one output row per pair
    "matmul_planes": MatmulShape(3, 6, 4, 2, 16, 16, 0, (-128, 127), corrected=False,
                                 planes=True),
    # down_proj on byte planes: a (2, 6) image of 5 input blocks, each pixel's pair joined
    "dense_planes": ConvShape(1, 2, 6, 5, 3, 1, 1, (1, 1), (0,) * 4, (1, 1), 16, 16, 0, 0,
                              (-32768, 32767), planes=True),
    # Q4_1 weights: 4 rows, three groups of two K blocks, 3 output blocks; and on planes
    "grouped_dense": GroupedShape(4, 6, 3, 2, 16, 16, 3, 0, (-128, 127)),
    "grouped_planes": GroupedShape(3, 4, 2, 2, 16, 16, 5, 0, (-128, 127), planes=True),
}


def sampled(task: Task, knobs=None):
    sch = s_tir.Schedule(task.workload())
    sample_knobs(sch, task.shape, fixed=knobs)
    return sch
