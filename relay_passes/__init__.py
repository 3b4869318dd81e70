"""Graph level (Relax): DSA patterns, partitioning, lowering to layer descriptions, offload.

``partition_for_dsa`` -> ``offload_regions``; see each module's docstring.
"""

from .offload import LAUNCH, OffloadResult, offload_regions
from .partition import PartitionReport, partition_for_dsa
from .to_layers import region_from_function

__all__ = ["LAUNCH", "OffloadResult", "PartitionReport", "offload_regions", "partition_for_dsa",
           "region_from_function"]
