"""The recovery engine: pure Python, no Django import (tests/test_engine_purity.py enforces it)."""
