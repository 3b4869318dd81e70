"""Graph level (Relax): DSA patterns, partitioning, lowering to layer descriptions, offload.

``partition_for_dsa`` (prepare -> match -> fuse and merge -> read regions -> report) ->
``offload_regions`` (launch the regions the compiler took, inline the rest); the
compiler runs the same stages one by one (``dsa_tvm.pipeline.compile_for_dsa``).
See each module's docstring.
"""

from .offload import LAUNCH, offload_regions
from .partition import PartitionReport, RegionRead, partition_for_dsa, read_regions
from .to_layers import region_from_function

__all__ = ["LAUNCH", "PartitionReport", "RegionRead", "offload_regions", "partition_for_dsa",
           "read_regions", "region_from_function"]
