#!/bin/sh
# STAND-IN for nvidia-smi, for tests only. It is NOT NVIDIA's tool and has no GPU behind it.
#
# tests/test_gpu_host.py installs it as /usr/local/bin/nvidia-smi on the systemd test host
# (which has no GPU) and removes it afterwards, so that the "GPU memory released" check runs
# end to end over SSH against real processes and a real systemd stop. It answers the two CSV
# queries the plugin makes, with the values captured on a real H200 host
# (tests/data/nvidia-smi-h200): one GPU, and, for every PID listed in $STATE/pids that is still
# running, a compute-apps row holding 21090 MiB, as vLLM's process did there. A PID leaves the
# list when its process is gone (the real release took about 0.2 s more).
STATE=/run/specdecode-nvidia-smi-standin
UUID=GPU-695d5997-a103-0d89-580b-71c5e61fbbe2

query="" fields="" header=yes
for arg in "$@"; do
  case "$arg" in
    --query-gpu=*) query=gpu fields=${arg#*=} ;;
    --query-compute-apps=*) query=apps fields=${arg#*=} ;;
    --format=*noheader*) header=no ;;
  esac
done
[ -n "$query" ] || { echo "stand-in nvidia-smi: only --query-gpu and --query-compute-apps" >&2; exit 2; }

alive() {
  [ -f "$STATE/pids" ] || return 0
  while read -r pid; do [ -d "/proc/$pid" ] && echo "$pid"; done <"$STATE/pids"
}

value() {  # value FIELD PID
  case "$1" in
    index) echo 0 ;;
    uuid | gpu_uuid) echo "$UUID" ;;
    name | gpu_name) echo "NVIDIA H200" ;;
    driver_version) echo 580.159.04 ;;
    memory.total) echo "143771 MiB" ;;
    memory.used) if [ -n "$(alive)" ]; then echo "21099 MiB"; else echo "0 MiB"; fi ;;
    pid) echo "$2" ;;
    used_memory | used_gpu_memory) echo "21090 MiB" ;;
    process_name) cat "/proc/$2/comm" 2>/dev/null || echo "[Not Found]" ;;
    *) echo "[N/A]" ;;
  esac
}

line() {  # line PID: one CSV row of the requested fields
  out="" sep=""
  for f in $(echo "$fields" | tr ',' ' '); do
    out="$out$sep$(value "$f" "$1")" sep=", "
  done
  echo "$out"
}

if [ "$header" = yes ]; then
  echo "$fields" | sed 's/,/, /g; s/used_memory/used_gpu_memory [MiB]/; s/memory\.\(total\|used\)/& [MiB]/g'
fi
if [ "$query" = gpu ]; then
  line ""
else
  for pid in $(alive); do line "$pid"; done
fi
exit 0
