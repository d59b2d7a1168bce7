"""The peers ``bench.trickle`` measures the same workloads on, each in a virtualenv of its own.

The modules named ``*_app`` and ``*_client`` run in the peer's virtualenv (they import the
peer, never Django or this project); the others run in the project's and drive them.
"""
