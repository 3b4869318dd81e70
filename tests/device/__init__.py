"""Tests of the device: hardware descriptions, the instruction set and its containers, the simulator."""
