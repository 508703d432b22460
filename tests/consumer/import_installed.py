"""The installed Python package finds the C library installed next to it (no MOEKIT_LIBRARY)."""

import os
import pathlib

import moekit

assert "MOEKIT_LIBRARY" not in os.environ
here = pathlib.Path(moekit.__file__).resolve().parent
assert pathlib.Path(moekit.library_path).resolve().parent == here, moekit.library_path
print(moekit.__version__, moekit.library_path)
print(moekit.explain("tiny", device="cpu"))
