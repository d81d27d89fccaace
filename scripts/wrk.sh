#!/usr/bin/env bash
# HTTP throughput under wrk: an axum hello-world (`examples/wrk_server.rs`) behind each
# middleware in turn, on this machine, against a private Redis.
#
#   ./scripts/wrk.sh [MIDDLEWARE...]      # default: all of them, in the table's order
#
# MIDDLEWARE is one of none, governor, memory, redis-lease, redis, redis-keys (what each is:
# the example's docs). The script starts a server for each and warms it up with wrk for 1 s,
# then runs wrk on each in turn (64 connections for 5 s), ROUNDS times round by round, so that
# load from elsewhere on the machine falls on all alike, and keeps each one's median requests/s
# and the median of its ratios to `none` in the same round.
# The hot-key middlewares get one fixed `x-api-key`; `redis-keys` gets 10 000 in turn
# (`scripts/wrk-keys.lua`).
# A run that saw a non-2xx answer or a socket error fails. It prints a table, `middleware |
# requests/s | / no limiter`, and the machine's load average before and after.
#
# Environment: WRK_CONNECTIONS (64), WRK_DURATION (5s), WRK_ROUNDS (3), WRK_THREADS (nproc),
# CARGO_TARGET_DIR (target).
#
# wrk and redis-server are installed with apt-get (as root, or through sudo) when missing:
# `./scripts/wrk.sh --install-only` just installs them. Redis runs on a free port without
# persistence; everything the script starts is stopped when it exits.
set -euo pipefail

cd "$(dirname "$0")/.."

CONNECTIONS=${WRK_CONNECTIONS:-64}
DURATION=${WRK_DURATION:-5s}
ROUNDS=${WRK_ROUNDS:-3}
THREADS=${WRK_THREADS:-$(nproc)}
ALL=(none governor memory redis-lease redis redis-keys)

# `install PACKAGE COMMAND`: apt-get when the command is missing.
. scripts/install.sh

install wrk wrk
# Debian's package may start a system-wide Redis on 6379; this script does not use it.
install redis-server redis-server
install redis-tools redis-cli

if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi

middlewares=("$@")
if [ ${#middlewares[@]} -eq 0 ]; then
    middlewares=("${ALL[@]}")
fi
for m in "${middlewares[@]}"; do
    if [[ ! " ${ALL[*]} " =~ " $m " ]]; then
        echo "error: unknown middleware $m (expected: ${ALL[*]})" >&2
        exit 2
    fi
done

cargo build --release --quiet --example wrk_server
target=${CARGO_TARGET_DIR:-target}
server_bin=$target/release/examples/wrk_server

# The logs, and Redis's directory.
work=$(mktemp -d)
redis_pid=
server_pids=()
stop() {
    for pid in ${server_pids[@]+"${server_pids[@]}"} $redis_pid; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap stop EXIT

# A private Redis on a free port: tries random ports until one starts and answers PING.
redis_port=
for _ in $(seq 20); do
    port=$((20000 + RANDOM % 40000))
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$work" \
        >"$work/redis.log" 2>&1 &
    redis_pid=$!
    for _ in $(seq 50); do
        if redis-cli -p "$port" ping >/dev/null 2>&1; then
            redis_port=$port
            break 2
        fi
        kill -0 "$redis_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=
done
if [ -z "$redis_port" ]; then
    echo "error: redis-server did not start:" >&2
    cat "$work/redis.log" >&2
    exit 1
fi
redis_url=redis://127.0.0.1:$redis_port/

# Starts the server for middleware $1 on a free port; sets url[$1].
declare -A url
start_server() {
    local log=$work/$1.log pid
    : >"$log" # before the server opens it in the background
    "$server_bin" "$1" --bind 127.0.0.1:0 --redis "$redis_url" >"$log" 2>&1 &
    pid=$!
    server_pids+=("$pid")
    for _ in $(seq 100); do
        url[$1]=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$log")
        [ -n "${url[$1]}" ] && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    echo "error: the $1 server did not start:" >&2
    cat "$log" >&2
    return 1
}

# Runs wrk for $1 on middleware $2's server with its requests; prints the requests/s.
run_wrk() {
    local duration=$1 m=$2 out
    local requests=(-H "x-api-key: hot" "${url[$m]}")
    if [ "$m" = redis-keys ]; then
        requests=(-s scripts/wrk-keys.lua "${url[$m]}" -- 10000)
    fi
    out=$(wrk -t "$THREADS" -c "$CONNECTIONS" -d "$duration" "${requests[@]}")
    if grep -Eq 'Non-2xx|Socket errors' <<<"$out"; then
        echo "error: wrk on $m saw failures:" >&2
        echo "$out" >&2
        return 1
    fi
    awk '/^Requests\/sec:/ { print $2 }' <<<"$out"
}

# The median of the numbers on stdin.
median() {
    sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

label() {
    case $1 in
        none) echo "\`none\`: no limiter" ;;
        governor) echo "\`governor\`: tower_governor 0.8 (in memory)" ;;
        memory) echo "\`memory\`: redlimit over \`MemoryStore\`" ;;
        redis-lease) echo "\`redis-lease\`: redlimit over \`RedisStore\` with leases (one hot key)" ;;
        redis) echo "\`redis\`: redlimit over \`RedisStore\`, default batching, one hot key" ;;
        redis-keys) echo "\`redis-keys\`: the same, 10 000 keys (\`HeaderKey\`)" ;;
    esac
}

# 72922.1 -> "72 922"
thousands() {
    printf '%.0f' "$1" | sed ':a; s/\([0-9]\)\([0-9]\{3\}\)\($\| \)/\1 \2\3/; ta'
}

echo "wrk $(wrk -v 2>&1 | head -1 | awk '{ print $2 }'), $(redis-server --version | awk '{ print $3 }'), $(nproc) CPUs"
echo "wrk -t $THREADS -c $CONNECTIONS -d $DURATION, $ROUNDS rounds after 1 s of warm-up, medians"
echo "load average before: $(cut -d ' ' -f 1-3 /proc/loadavg)"

for m in "${middlewares[@]}"; do
    start_server "$m"
    run_wrk 1s "$m" >/dev/null
done
# Round by round, so that the machine's other load falls on every middleware alike.
declare -A rounds rate
for _ in $(seq "$ROUNDS"); do
    for m in "${middlewares[@]}"; do
        rounds[$m]+="$(run_wrk "$DURATION" "$m") "
    done
done
for m in "${middlewares[@]}"; do
    # shellcheck disable=SC2086 # one number per word
    rate[$m]=$(printf '%s\n' ${rounds[$m]} | median)
    echo "$m: ${rounds[$m]}requests/s, median ${rate[$m]}" >&2
done

echo "load average after: $(cut -d ' ' -f 1-3 /proc/loadavg)"
echo
echo "| middleware | requests/s | / no limiter |"
echo "|---|---|---|"
for m in "${middlewares[@]}"; do
    ratio=n/a
    if [ -n "${rate[none]:-}" ]; then
        # The median of the rounds' ratios: each round's own `none` is the one run nearest it.
        ratio=$(paste -d ' ' <(tr ' ' '\n' <<<"${rounds[$m]}") <(tr ' ' '\n' <<<"${rounds[none]}") |
            awk 'NF == 2 { print $1 / $2 }' | median | xargs printf '%.3f')
    fi
    echo "| $(label "$m") | $(thousands "${rate[$m]}") | $ratio |"
done
