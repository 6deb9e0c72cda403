"""What benchmarks, parses and prints the algorithms; shared by both transports, and not
algorithms itself.

* ``catalog``: each collective with its nccl-tests kind, arguments and bus bandwidth factor.
* ``bench``: the benchmark's configuration (``bench_config``), rows in nccl-tests' columns,
  the data check and the output formats.
* ``cli``: the command-line scaffold of ``simcomm`` and ``realcomm`` and the bench flags.
* ``units``: sizes, times and rates written with units (``1MiB``, ``5us``, ``100GB/s``).
* ``model_presets``: published models (ResNet-50, BERT, GPT-2, LLaMA) for the training
  schedules.

Like the rest of ``algorithms``, it imports neither transport.
"""
