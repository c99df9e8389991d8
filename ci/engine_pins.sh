#!/usr/bin/env bash
# Can `mla_fuse[test]` be installed next to what the serving engines install? For each pin set
# below, pip's resolver runs a dry run (`pip install --dry-run --ignore-installed`: nothing is
# installed) of this checkout's `.[test]` next to the pins; the script fails, with pip's answer,
# when any set does not resolve (docs/VERSIONS.md).
#
# pip reads each wheel's metadata from the index (PEP 658) where the index serves it, and
# otherwise reads only the metadata file inside the wheel with HTTP range requests (fast-deps):
# no multi-GB wheel is downloaded. The sets run in parallel (network-bound); about 3.5 minutes
# on the 2-core development machine, the SGLang set being the longest.
# pip runs --isolated: a developer's pip configuration (a local torch cap, a local index) plays
# no part, the answer is PyPI's.
# Usage: ci/engine_pins.sh ["PIN PIN ..." ...]   (default: the sets below)
set -euo pipefail
cd "$(dirname "$0")/.."

PIN_SETS=(
    "vllm==0.33.0"                                   # installs torch 2.14.0, which requires triton 3.8.0
    "sglang==0.5.23 flashinfer-python==0.7.2"        # torch 2.14.1, triton 3.8.0
    "torch==2.14.1 triton==3.8.0"
    "torch==2.14.0 triton==3.8.0"
    "torch==2.13.0 triton==3.7.1"                    # the CUDA build of torch 2.13.0 requires triton 3.7.1
    "torch==2.12.1 triton==3.7.1"                    # engines pinned to torch 2.12
    "torch==2.11.0 triton==3.6.0"                    # the floor: engines pinned to torch 2.11
)
if [ $# -gt 0 ]; then
    PIN_SETS=("$@")
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/pip"
"$work/pip/bin/python" -m pip install -q --isolated --upgrade pip

status=0
pids=()
for index in "${!PIN_SETS[@]}"; do
    # shellcheck disable=SC2086  # a pin set is several requirements
    ( start=$SECONDS
      if "$work/pip/bin/python" -m pip install --isolated --dry-run --ignore-installed \
             --use-feature=fast-deps --report "$work/$index.json" ".[test]" ${PIN_SETS[$index]} \
             >"$work/$index.log" 2>&1; then
          echo ok >"$work/$index.status"
      fi
      echo $((SECONDS - start)) >"$work/$index.seconds" ) &
    pids+=($!)
done
wait "${pids[@]}"

for index in "${!PIN_SETS[@]}"; do
    pins="${PIN_SETS[$index]}"
    seconds="$(cat "$work/$index.seconds")"
    if [ -f "$work/$index.status" ]; then
        resolved="$("$work/pip/bin/python" - "$work/$index.json" <<'EOF'
import json, sys
versions = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in json.load(open(sys.argv[1]))["install"]}
print(", ".join(f"{name} {versions[name]}" for name in ("torch", "triton", "hypothesis") if name in versions))
EOF
)"
        echo "resolves: .[test] with $pins -> $resolved (${seconds} s)"
    else
        echo "DOES NOT RESOLVE: .[test] with $pins (${seconds} s); pip said:"
        conflict="$(sed -n '/conflict is caused by/,$p' "$work/$index.log" | head -n 40)"
        if [ -n "$conflict" ]; then
            echo "$conflict" | sed 's/^/    /'
        else  # not a conflict (the index unreachable, say): pip's last words
            tail -n 15 "$work/$index.log" | sed 's/^/    /'
        fi
        status=1
    fi
done
exit $status
