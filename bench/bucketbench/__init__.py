"""bucketbench: benchmark bucketfs against peer FUSE filesystems for object stores.

Modules: install (dependencies), servers (MinIO, fake-gcs-server, toxiproxy,
seed data), systems (the filesystems), experiments and fiobench (what is
measured), report (REPORT.md and charts), runner (the command line).
"""
