"""An Evaluator replica's script as TFJob users wrote one: it never exits on its own; it watches the training's
checkpoints and reports each new one until its pod is stopped (the operator's CleanPodPolicy did that)."""

import json
import os
import sys
import time


def main() -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    if config["task"] != {"type": "evaluator", "index": 0} or "evaluator" not in config["cluster"]:
        print(f"not the operator's evaluator TF_CONFIG: {config}", file=sys.stderr)
        return 3
    print(f"evaluator: TF_CONFIG cluster {sorted(config['cluster'])}", flush=True)
    seen: set[str] = set()
    while True:
        for root, _, files in os.walk(sys.argv[1]):
            for name in files:
                path = os.path.join(root, name)
                if name.endswith(".index") and path not in seen:
                    seen.add(path)
                    print(f"evaluator: new checkpoint {os.path.relpath(path, sys.argv[1])}", flush=True)
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
