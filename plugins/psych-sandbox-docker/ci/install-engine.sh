#!/usr/bin/env bash
# Install and start a local container engine for the psych-sandbox Docker backend.
#
# Debian 12, run as root. Idempotent: safe to run again, and safe when dockerd
# already runs. Installs Debian's docker.io and runsc (gVisor), registers runsc
# as the Docker runtime "runsc", starts dockerd in the background when no engine
# answers, and waits (bounded) for `docker info` to answer.
# The runsc runtime runs with: --network=none --platform=ptrace --host-uds=open.
#
# Environment knobs:
#   PSYCH_DOCKER_WAIT_SECONDS   deadline for the engine to answer (default 60)
#   PSYCH_DOCKERD_LOG           dockerd log file (default /var/log/psych-sandbox-dockerd.log)
#   PSYCH_RUNSC_PLATFORM        gVisor platform (default ptrace; Debian's 2022 build has no systrap)
set -euo pipefail

WAIT_SECONDS="${PSYCH_DOCKER_WAIT_SECONDS:-60}"
DOCKERD_LOG="${PSYCH_DOCKERD_LOG:-/var/log/psych-sandbox-dockerd.log}"
RUNSC_PLATFORM="${PSYCH_RUNSC_PLATFORM:-ptrace}"
DAEMON_JSON=/etc/docker/daemon.json
RUNTIME_NAME=runsc
# --host-uds=open lets the sandbox connect() to a host Unix socket bind-mounted
# into it (the per-execution control channel); without it any access to such a
# socket fails with EPERM. The sandbox still cannot create host sockets.
RUNSC_ARGS=(--network=none "--platform=$RUNSC_PLATFORM" --host-uds=open)

die() {
    echo "install-engine: ERROR: $*" >&2
    exit 1
}
log() { echo "install-engine: $*" >&2; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v apt-get >/dev/null || die "apt-get not found (Debian 12 expected)"

# --- 1. packages ------------------------------------------------------------
need_pkgs=()
for pkg in docker.io runsc; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
        need_pkgs+=("$pkg")
    fi
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" \
        || die "apt-get install ${need_pkgs[*]} failed"
else
    log "docker.io and runsc already installed"
fi

RUNSC_PATH="$(command -v runsc || true)"
[ -n "$RUNSC_PATH" ] || RUNSC_PATH=/usr/bin/runsc
[ -x "$RUNSC_PATH" ] || die "runsc binary not found after install"
[ -x /usr/sbin/dockerd ] || command -v dockerd >/dev/null || die "dockerd not found after install"
DOCKERD="$(command -v dockerd || echo /usr/sbin/dockerd)"

# The client used to talk to the engine: whichever `docker` is first on PATH
# (Debian's /usr/bin/docker, or a newer static client; both negotiate the API).
command -v docker >/dev/null || die "docker client not found after install"

# --- 2. daemon.json: register runsc, keep everything else ------------------
command -v python3 >/dev/null || die "python3 is needed to merge $DAEMON_JSON"
mkdir -p /etc/docker
new_json="$(mktemp)"
trap 'rm -f "$new_json"' EXIT
python3 - "$DAEMON_JSON" "$new_json" "$RUNTIME_NAME" "$RUNSC_PATH" "${RUNSC_ARGS[@]}" <<'PY' \
    || die "could not write $DAEMON_JSON (is the existing file valid JSON?)"
import json, os, sys
src, dst, name, path = sys.argv[1:5]
args = sys.argv[5:]
cfg = {}
if os.path.exists(src) and os.path.getsize(src) > 0:
    with open(src) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise SystemExit(f"{src}: top level is not an object")
runtimes = cfg.setdefault("runtimes", {})
runtimes[name] = {
    "path": path,
    "runtimeArgs": args,
}
with open(dst, "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)
    f.write("\n")
PY

config_changed=0
if ! cmp -s "$new_json" "$DAEMON_JSON"; then
    install -m 0644 "$new_json" "$DAEMON_JSON"
    config_changed=1
    log "wrote $DAEMON_JSON"
fi

# --- 3. start or reload the engine ------------------------------------------
engine_answers() { docker info >/dev/null 2>&1; }

wait_for_engine() {
    local deadline=$((SECONDS + WAIT_SECONDS))
    until engine_answers; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "install-engine: last lines of $DOCKERD_LOG:" >&2
            tail -n 30 "$DOCKERD_LOG" >&2 2>/dev/null || true
            die "docker engine did not answer within ${WAIT_SECONDS}s"
        fi
        if [ -n "${dockerd_pid:-}" ] && ! kill -0 "$dockerd_pid" 2>/dev/null; then
            echo "install-engine: last lines of $DOCKERD_LOG:" >&2
            tail -n 30 "$DOCKERD_LOG" >&2 2>/dev/null || true
            die "dockerd (pid $dockerd_pid) exited during start-up"
        fi
        sleep 0.2
    done
}

# True when the running engine knows the runtime with exactly the wanted arguments.
runtime_registered() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | python3 -c '
import json, sys
rt = (json.load(sys.stdin) or {}).get(sys.argv[1]) or {}
sys.exit(0 if rt.get("runtimeArgs") == sys.argv[2:] else 1)
' "$RUNTIME_NAME" "${RUNSC_ARGS[@]}"
}

if engine_answers; then
    log "docker engine already answers"
    if [ "$config_changed" -eq 1 ] || ! runtime_registered; then
        # dockerd re-reads "runtimes" from daemon.json on SIGHUP.
        pid="$(cat /var/run/docker.pid 2>/dev/null || pidof dockerd || true)"
        [ -n "$pid" ] || die "engine answers but no dockerd pid found to reload"
        log "reloading dockerd (pid $pid) to pick up the runsc runtime"
        kill -HUP $pid
        deadline=$((SECONDS + WAIT_SECONDS))
        until runtime_registered; do
            [ "$SECONDS" -lt "$deadline" ] || die "runtime '$RUNTIME_NAME' not registered after reload"
            sleep 0.2
        done
    fi
else
    # A stale pid file from a dead dockerd stops a new one from starting.
    if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
        rm -f /var/run/docker.pid
    fi
    if pidof dockerd >/dev/null; then
        log "dockerd is running but not answering yet; waiting"
    else
        log "starting dockerd (log: $DOCKERD_LOG)"
        mkdir -p "$(dirname "$DOCKERD_LOG")"
        # containerd is started by dockerd itself when not running as a service.
        nohup "$DOCKERD" >>"$DOCKERD_LOG" 2>&1 </dev/null &
        dockerd_pid=$!
        disown "$dockerd_pid" 2>/dev/null || true
    fi
    wait_for_engine
fi

runtime_registered || die "docker engine answers but runtime '$RUNTIME_NAME' is not registered"
log "ready: $(docker info --format 'server {{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}}, runtimes {{range $k, $v := .Runtimes}}{{$k}} {{end}}')"
