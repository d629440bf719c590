"""What several test files share, by concern: paths, child processes, compiled pipelines, records, TensorBoard files,
parameter-server clusters (in-process and as processes).

Test files import from here, never from another test file or from conftest (tests/test_structure.py checks it);
conftest.py holds only fixtures.
"""
