"""Lowering an Algorithm's steps to MSCCL++ operations: lanes and their semaphores (``lanes``), a lane's
ops and threadblocks (``ops``), and the LL packet form (``packets``). ``mscclpp.export`` assembles the plan."""
