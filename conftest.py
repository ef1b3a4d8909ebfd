"""Root conftest: pytest-mgpu itself loads through its pytest11 entry point, not from here.

Only project-wide collection rules live here.
"""
collect_ignore = ["benchmarks", "build"]
