"""Helpers the tests share, by concern. Test modules import them from here; conftest files hold the fixtures
and hooks (with their private parts) and import what they need from here too.

- ``paths``: the repository, examples/kb and the CMRC 2018 subset.
- ``processes``: ``strata`` subprocesses (``strata_env``, ``run_strata``), free ports, stopping, waiting.
- ``milvus``: where a test's leaves live (``MilvusTarget``), server collections, a ``milvus-lite server``.
- ``stores``: PostgreSQL databases of a test's own, settings, the stores opened in the test process.
- ``servers``: private Redis and PostgreSQL servers to stop, pause and restart.
- ``snapshots``: what the stores hold for a kb, read back.
- ``retrieval``: querying a kb and comparing two copies of one.
- ``documents``: made-up files, documents, queries, PDFs and chunk trees.
- ``crash``: a kb updated by a run that crashes at a write step.
- ``fakes``: encoders and a leaf index that wrap the real ones.
- ``api``: the service's test keys and settings.
"""
