"""What bench/gpu's PyTorch scripts (torch_bench.py, torch_train.py) share:
writing their JSON, saying why they skip, reading a comma-separated choice,
and finding a usable CUDA device through torch. Standard library only; torch is imported here, lazily."""
import json


def write_json(path, obj):
    """Writes obj to path as indented JSON (nothing when path is empty)."""
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")


def skip(tool, benchmark, json_path, reason):
    """Prints "<tool>: skipped: <reason>", records it in the JSON, returns 0."""
    print("%s: skipped: %s" % (tool, reason))
    write_json(json_path, {"benchmark": benchmark, "skipped": reason})
    return 0


def cuda_unavailable(device):
    """Why torch cannot run on CUDA device `device` (a sentence), or None."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        return "PyTorch is not installed (import torch: %s)" % e
    if not torch.cuda.is_available():
        return ("torch %s sees no CUDA device (torch.cuda.is_available() is False)"
                % getattr(torch, "__version__", "?"))
    if device >= torch.cuda.device_count():
        return "--device %d, but torch sees %d device(s)" % (device, torch.cuda.device_count())
    return None


def choose(parser, text, known, what):
    """The comma-separated names in text; parser.error on one not in known."""
    names = [n for n in text.split(",") if n]
    for n in names:
        if n not in known:
            parser.error("unknown %s %r (%s)" % (what, n, ", ".join(known)))
    return names
