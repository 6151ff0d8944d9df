"""The benchmarks' tables (Markdown, on stdout) and plots (PNG, with matplotlib)."""
import importlib.util
import math
import sys

from .environment import environment_line


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def builtin_name(device):
    return "cuDNN" if device == "cuda" else "oneDNN"


def column_names(device):
    """The table's heading for each candidate, in the order they are printed."""
    builtin = builtin_name(device)
    return {"torch_convbp": "torch_convbp", "builtin": builtin, "torch_convbp_channels_last": "torch_convbp channels_last",
            "builtin_channels_last": f"{builtin} channels_last",
            "builtin_deterministic": f"{builtin} deterministic", "aten_im2col": "ATen im2col", "gemm": "bare GEMMs"}


def batch_text(args):
    return f"batch {args['batch']}" if args.get("batch") else "each layer at its batch"


def print_layers(result, file=None):
    file = file or sys.stdout
    a, rows, ceiling = result["args"], result["rows"], result["ceilings"]
    names = {k: v for k, v in column_names(a["device"]).items() if f"{k}_ms" in rows[0]}
    others = [k for k in names if not k.startswith("torch_convbp")]
    memory = [k for k in names if f"{k}_peak_mib" in rows[0]]
    print(f"\n{result['machine']}, torch {result['torch']}, {result['date']}: {a['device']} {a['dtype']}, {batch_text(a)}, "
          f"{a['passes']} pass(es){', TF32 allowed' if a.get('tf32') else ''}"
          f"{', every candidate captured in a CUDA graph' if a.get('cuda_graphs') else ''}. Square {ceiling['square_gemm_size']}^3 GEMM: "
          f"{ceiling['square_gemm_gflops']:.0f} GFLOP/s; copy: {ceiling['copy_gbytes_per_s']:.0f} GB/s. Ratios are "
          f"torch_convbp's time over the other's (below 1: torch_convbp is faster); 'of peak' is torch_convbp's GFLOP/s "
          f"over the square GEMM's, timed in the same rounds as the layer.", file=file)
    if "environment" in result:
        print(environment_line(result["environment"]), file=file)
    heading = [f"{names[k]} ms" for k in names] + ["GFLOP/s", "of peak"] + [f"vs {names[k]}" for k in others]
    channels_last = "channels_last_vs_builtin_channels_last" in rows[0]
    heading += [f"channels_last: vs {names['builtin_channels_last']}"] if channels_last else []
    heading += [f"{names[k]} peak MiB" for k in memory]
    print("| layer | batch | " + " | ".join(heading) + " |", file=file)
    print("|---|---:|" + "---:|" * len(heading), file=file)
    for r in rows:
        cells = [str(r.get("batch", a["batch"]))] + [f"{r[f'{k}_ms']:.2f}" for k in names]
        cells += [f"{r['torch_convbp_gflops']:.0f}", f"{r['of_peak']:.0%}"]
        cells += [f"{r[f'vs_{k}']:.2f}" for k in others]
        cells += [f"{r['channels_last_vs_builtin_channels_last']:.2f}"] if channels_last else []
        cells += [f"{r[f'{k}_peak_mib']:.0f}" for k in memory]
        print(f"| {r['layer']} | " + " | ".join(cells) + " |", file=file)
    means = [f"**{geomean(r[f'vs_{k}'] for r in rows):.2f}**" for k in others]
    means += [f"**{geomean(r['channels_last_vs_builtin_channels_last'] for r in rows):.2f}**"] if channels_last else []
    print("| **geometric mean** | " + " | ".join([""] * (len(names) + 3) + means + [""] * len(memory)) + " |", file=file)


def print_memory(rows, file=None):
    file = file or sys.stdout
    print("\nPeak workspace of one forward+backward (torch_convbp's scratch memory; the output is for scale):", file=file)
    print("| layer | batch | output MiB | peak MiB (limit 1 GiB) | s | peak MiB (limit 64 MiB) | s |", file=file)
    print("|---|---:|---:|---:|---:|---:|---:|", file=file)
    for r in rows:
        print(f"| {r['layer']} | {r['batch']} | {r['output_mib']:.0f} | {r['default_peak_mib']:.1f} | "
              f"{r['default_seconds']:.3f} | {r['tight_peak_mib']:.1f} | {r['tight_seconds']:.3f} |", file=file)


def print_scaling(rows, file=None):
    file = file or sys.stdout
    print(f"\nScaling of one forward+backward, {rows[0]['layer']} (linear when ns per output pixel stays flat):", file=file)
    print("| varied | batch | image size | torch_convbp ms | ns/pixel | builtin ms | ns/pixel |", file=file)
    print("|---|---:|---:|---:|---:|---:|---:|", file=file)
    for r in rows:
        print(f"| {r['axis']} | {r['batch']} | {r['size']} | {r['torch_convbp_ms']:.2f} | {r['torch_convbp_ns_per_pixel']:.2f} | "
              f"{r['builtin_ms']:.2f} | {r['builtin_ns_per_pixel']:.2f} |", file=file)


def check_plotting(parser, args):
    """Refuse --plot before anything is timed when matplotlib is missing, not after the run."""
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install matplotlib)")


def plot(result, path):
    """A PNG of the ratios per layer (needs matplotlib)."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, a = result["rows"], result["args"]
    names = [r["layer"] for r in rows]
    series = [(f"vs {builtin_name(a['device'])}", "vs_builtin", "#1f77b4"),
              ("vs ATen im2col", "vs_aten_im2col", "#ff7f0e"),
              ("vs bare GEMMs", "vs_gemm", "#7f7f7f")]
    if "channels_last_vs_builtin_channels_last" in rows[0]:  # both fed channels_last
        series.append((f"channels_last: vs {builtin_name(a['device'])} channels_last",
                       "channels_last_vs_builtin_channels_last", "#2ca02c"))
    fig, ax = plt.subplots(figsize=(9, 0.15 * len(series) * len(rows) + 1.6))
    height = 0.8 / len(series)
    for i, (label, key, color) in enumerate(series):  # bars from 1 to the ratio
        offset = (i - (len(series) - 1) / 2) * height
        ax.barh([j + offset for j in range(len(rows))], [r[key] - 1 for r in rows], height, left=1,
                label=label, color=color)
    ax.set_xscale("log", base=2)
    ratios = [r[key] for r in rows for _, key, _ in series]
    ax.set_xlim(min(0.25, min(ratios) / 1.2), max(4.0, max(ratios) * 1.2))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    finish_ratio_plot(fig, ax, path, range(len(rows)), names,
                      "torch_convbp time / other time (log scale; left of 1: torch_convbp is faster)",
                      f"torch_convbp, {a['passes']} pass(es), {a['dtype']}, {batch_text(a)}\n"
                      f"{result['machine']}, {result['date']}")


def finish_ratio_plot(fig, ax, path, yticks, labels, xlabel, title):
    """What every ratio plot of the benchmarks shares (bench_models.py too): horizontal bars
    against a line at 1, labelled rows from the top, the legend beside the bars (never over
    them), and the PNG."""
    import matplotlib.pyplot as plt

    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(yticks, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
