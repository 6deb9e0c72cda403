"""DataParallel against DDP, and the DDP bucket size, in numbers.

The seeds tell the story: DataParallel runs every exchange through a master GPU (replicate the
model, scatter the inputs, gather the outputs, reduce the gradients), DDP all-reduces
gradients in buckets while backward is still running. This script puts numbers on it for
ResNet-50 and BERT-base on one DGX A100, then sweeps DDP's bucket cap for ResNet-50 across
two DGX H100 nodes, where the cap alone changes the step time severalfold.

Run: python examples/dp_vs_ddp.py [--plot sweep.png]
"""

from __future__ import annotations

import argparse

from algorithms.harness.model_presets import preset_model
from simcomm.presets import make_preset
from simcomm.train_cli import format_comparison, format_sweep
from simcomm.training import bucket_sweep, simulate_ddp, simulate_dp

CAPS = [2**k for k in range(18, 31, 2)]  # 256 KiB to 1 GiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", metavar="FILE.png", help="draw the bucket sweep")
    args = parser.parse_args()

    machine = make_preset("dgx-a100")
    for name in ("resnet50", "bert-base"):
        model = preset_model(name)
        reports = [simulate_ddp(model, machine), simulate_ddp(model, machine, overlap=False),
                   simulate_dp(model, machine)]
        print(f"{name}, one step on {machine.name} ({machine.size} GPUs), "
              f"{model.param_bytes / 2**20:.0f} MiB of gradients:")
        print(format_comparison(reports))
        print()

    cluster = make_preset("cluster-h100:nodes=2")
    model = preset_model("resnet50")
    sweep = bucket_sweep(model, cluster, CAPS)
    print(f"resnet50 on {cluster.name} ({cluster.size} GPUs): DDP step against bucket cap")
    print(format_sweep(sweep))
    slowest = max(sweep, key=lambda r: r.step)
    fastest = min(sweep, key=lambda r: r.step)
    print(f"\nthe cap alone changes the step time {slowest.step / fastest.step:.1f}x")
    if args.plot:
        from simcomm.plots import bucket_sweep_figure, save_png

        save_png(bucket_sweep_figure(sweep, f"resnet50 DDP on {cluster.name}"), args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
