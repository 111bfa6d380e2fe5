"""Output paths of ``gnnpar-train`` (and ``gnnpar-predict``): every file and folder a run
writes, checked before any work against what it reads and against folders other gnnpar runs
own, so a finished run never fails at writing its results and no output lands in a gnnpar
folder that is not its own."""
from __future__ import annotations

import os

from gnnpar.datasets import DEFAULT_SPEC, InputError, parse_spec
from gnnpar.datasets.owned import cache_overlap, check_writable_folder, refuse_claimed
from gnnpar.infer.predict_files import check_out
from gnnpar.training.logged import check_log_free


def _dataset_inputs(dataset):
    """(what, path, is_folder) of the file or folder the dataset (spec) is read from."""
    kind, params = parse_spec(dataset or DEFAULT_SPEC)
    if params.get("path"):
        return [(f"the dataset ({kind}:{params['path']})", params["path"], False)]
    if params.get("dir"):
        return [(f"the dataset ({kind}:{params['dir']})", params["dir"], True)]
    return []


def inputs_of(args):
    """Paths a run reads or owns, which no output file may be or lie inside."""
    out = _dataset_inputs(args.dataset)
    for flag in ("partition_dir", "checkpoint_dir", "cache_dir"):
        value = getattr(args, flag, None)
        if value:
            out.append((f"--{flag.replace('_', '-')} {value}", value,
                        "cache" if flag == "cache_dir" else True))
    return out


def overlaps(out: str, inp: str, folder: bool = False) -> str:
    """"overwrite" when ``out`` is ``inp`` (by inode or resolved path), "write into" when it
    lies inside ``inp``, a folder (``folder``: one, existing or not, gnnpar reads or owns;
    ``"cache"``: a --cache-dir, of which gnnpar owns only the entries)."""
    if folder == "cache":
        return cache_overlap(out, inp)
    try:
        if os.path.exists(out) and os.path.exists(inp) and os.path.samefile(out, inp):
            return "overwrite"
    except OSError:
        pass
    ro, ri = os.path.realpath(out), os.path.realpath(inp)
    if ro == ri:
        return "overwrite"
    inside = ro.startswith(ri.rstrip(os.sep) + os.sep)
    return "write into" if inside and (folder or os.path.isdir(ri)) else ""


def check_output_file(flag: str, path: str, inputs=()) -> None:
    """Refuse an output file that cannot be written, or would overwrite an input: a folder, a
    file we may not write, a parent path that is a file or not writable, a path that is (or
    lies inside) one of ``inputs`` (``(what, path, is_folder)``), or one inside any gnnpar
    folder (:func:`~gnnpar.datasets.owned.refuse_claimed`: another run's shards, checkpoints
    or dataset cache)."""
    if not path:
        raise InputError(f"{flag} needs a file path")
    if os.path.isdir(path):
        raise InputError(f"{flag} {path} is a folder; give a file path")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise InputError(f"{flag} {path}: no permission to write this file")
    for what, inp, folder in inputs:
        how = overlaps(path, inp, folder)
        if how:
            raise InputError(f"{flag} {path} would {how} {what}; give another path")
    refuse_claimed(flag, path)
    if not os.path.exists(path) or os.path.isfile(path):  # not a device such as /dev/stdout
        check_writable_folder(os.path.dirname(os.path.abspath(path)), flag, f"{flag} {path}")


def check_output_paths(args) -> None:
    """``--log-json``, ``--save-model``, ``--profile-dir`` (with ``--profile``) and the folders
    the run writes into, checked before any work, so a finished run never fails at writing its
    results and no output lands in a gnnpar folder that is not its own."""
    inputs = inputs_of(args)
    outputs = [(f"--{flag.replace('_', '-')}", getattr(args, flag)) for flag in
               ("log_json", "save_model") if getattr(args, flag, None) is not None]
    for flag, path in outputs:
        check_output_file(flag, path, inputs)
    if len(outputs) == 2:
        first = outputs[0][1]
        device = os.path.exists(first) and not os.path.isfile(first)  # /dev/null twice is fine
        if not device and overlaps(first, outputs[1][1]) == "overwrite":
            raise InputError(f"--log-json and --save-model name the same file ({first}); "
                             "give two paths")
    if args.profile is not None:
        check_writable_folder(args.profile_dir, "--profile-dir")
        for what, inp, folder in inputs:
            if overlaps(args.profile_dir, inp, folder):
                raise InputError(f"--profile-dir {args.profile_dir} would write into {what}; "
                                 "give another folder")
        refuse_claimed("--profile-dir", args.profile_dir, include_self=True)
    if getattr(args, "save_predictions", None) is not None:
        check_out(args.save_predictions, "--save-predictions")
        for what, inp, folder in inputs:
            how = overlaps(args.save_predictions, inp, folder)
            if how:
                raise InputError(f"--save-predictions {args.save_predictions} would {how} "
                                 f"{what}; give another folder")
        for flag, path in outputs:
            if overlaps(path, args.save_predictions, True):
                raise InputError(f"{flag} {path} lies inside --save-predictions "
                                 f"{args.save_predictions}, which holds only predictions; "
                                 "give a path outside it")
    check_output_folders(args)
    check_log_free(getattr(args, "log_json", None))  # another live run writing it: exit 2


def check_output_folders(args) -> None:
    """The folders the run writes into (``--checkpoint-dir``, ``--cache-dir``, a
    ``--partition-dir`` it would fill) lie inside no gnnpar folder and not inside each other
    (a cache inside a shard folder would block rewriting it); ``--cache-dir`` is no gnnpar
    folder itself (the checkpoint and shard folders' own kind is checked when claimed)."""
    folders = [(flag, getattr(args, flag.lstrip("-").replace("-", "_"), None))
               for flag in ("--checkpoint-dir", "--cache-dir", "--partition-dir")]
    folders = [(flag, path) for flag, path in folders if path]
    for flag, path in folders:
        if flag == "--partition-dir" and os.path.lexists(os.path.join(path, "meta.json")):
            continue  # shards already there: read, not written
        refuse_claimed(flag, path, include_self=flag == "--cache-dir")
    for flag, path in folders:
        for other, where in folders:
            kind = "cache" if other == "--cache-dir" else True  # a cache: only its entries
            if other != flag and overlaps(path, where, kind):
                raise InputError(f"{flag} {path} lies inside {other} {where}; give folders "
                                 "that do not hold one another")
