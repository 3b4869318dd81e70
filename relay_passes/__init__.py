"""Graph level (Relax): DSA patterns, partitioning, lowering to layer descriptions, offload.

``partition_for_dsa`` -> ``offload_regions``; see each module's docstring.
"""

from .lower import region_from_function
from .offload import LAUNCH, OffloadResult, offload_regions
from .partition import PartitionReport, partition_for_dsa

__all__ = ["LAUNCH", "OffloadResult", "PartitionReport", "offload_regions", "partition_for_dsa",
           "region_from_function"]
