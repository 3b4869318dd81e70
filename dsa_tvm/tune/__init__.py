"""Autotuning DSA schedules with MetaSchedule, measured on the simulator."""
