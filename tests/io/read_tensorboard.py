"""Reads a folder of TensorBoard event files with TensorBoard's own EventAccumulator and
prints its scalars as JSON: {"tags": [...], "scalars": {tag: [[step, value], ...]}}.

Exits 77 when the tensorboard package is not importable, so the C++ test can skip.
    python read_tensorboard.py DIR
"""
import json
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as error:  # the test skips, saying why
    print(f"tensorboard is not importable: {error}", file=sys.stderr)
    sys.exit(77)


def main():
    accumulator = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    tags = sorted(accumulator.Tags()["scalars"])
    scalars = {tag: [[event.step, event.value] for event in accumulator.Scalars(tag)] for tag in tags}
    print(json.dumps({"tags": tags, "scalars": scalars}))


if __name__ == "__main__":
    main()
