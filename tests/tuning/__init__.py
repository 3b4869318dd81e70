"""Tests of autotuning with MetaSchedule."""
