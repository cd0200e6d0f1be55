"""The real PyTorch runtime (the only torch code; imports ``sim`` core).

It executes the same plans and schedule IR the simulator replays, one process per device:

- ``config``: the runnable model of a scenario and the checks made before launch (no torch);
- ``models``, ``layers``: torch modules, one per simulator layer (GPT, Llama, MLP), synthetic
  data, optimizers;
- ``tensor_parallel``: a device mesh per device set, tensor and sequence parallelism with
  ``parallelize_module``; ``sharding``: ZeRO-1 (``ZeroRedundancyOptimizer``) and FSDP2;
- ``comm``, ``p2p``: split-concat pieces, tags and replica groups; a rank's sends and receives;
- ``memory``: saved-activation bytes counted with saved-tensor hooks;
- ``holdings``: what a rank holds (stages, slices, neighbours); ``executor`` (``exec_types``):
  one rank running its lowered action list; ``session``: a run on every rank, gathered;
- ``grad_check``: the single-process reference and the gradient comparison;
- ``validate_loop``, ``validate_profile``, ``collapse``, ``tp_profile``: profile → run →
  simulate → compare, tensor-parallel plans with one simulated device per group;
- ``peer``: the same plan through ``torch.distributed.pipelining``;
- ``profiler``, ``bandwidth``, ``profile_run``: layer profiles, link and device measurements;
- ``launch``, ``worker``, ``status``: torchrun, local spawns, failure reports;
- ``cli``: ``dapple-run``'s options and dispatch to ``run_command``, ``profile_command`` and
  ``validate_command``, one module per subcommand.
"""
