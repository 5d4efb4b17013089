#!/bin/bash
# Three Warren nodes on this machine's loopback, for trying clustering and for
# benchmarks beside a 3-node RabbitMQ cluster.
#
#   deploy/local-cluster.sh start [DIR]   # nodes n1..n3: AMQP 5672-5674, metrics 15692-15694,
#                                         # cluster ports 25672-25674; data and logs under DIR
#   deploy/local-cluster.sh pids  [DIR]   # the nodes' pids, comma-separated
#   deploy/local-cluster.sh stop  [DIR]
#
# WARREN_SERVER (default: warren-server on PATH, else .venv/bin/warren-server),
# WARREN_CLUSTER_SECRET (default: a fixed local-only secret) and WARREN_NODE_PROCESSES
# (default 1: three nodes already share this machine's cores) may be set; a node's
# processes share its one cluster port.
set -euo pipefail
ACTION=${1:-}
DIR=${2:-./warren-cluster}
HERE=$(cd "$(dirname "$0")/.." && pwd)
SERVER=${WARREN_SERVER:-$(command -v warren-server || echo "$HERE/.venv/bin/warren-server")}
SECRET=${WARREN_CLUSTER_SECRET:-local-cluster-secret}
PROCESSES=${WARREN_NODE_PROCESSES:-1}
cluster_port() { echo $((25671 + $1)); }
NODES="[{\"name\": \"n1@local\", \"host\": \"127.0.0.1\", \"port\": $(cluster_port 1)}, {\"name\": \"n2@local\", \"host\": \"127.0.0.1\", \"port\": $(cluster_port 2)}, {\"name\": \"n3@local\", \"host\": \"127.0.0.1\", \"port\": $(cluster_port 3)}]"

case "$ACTION" in
    start)
        mkdir -p "$DIR"
        for i in 1 2 3; do
            mkdir -p "$DIR/n$i"
            WARREN_NODE_NAME="n$i@local" WARREN_CLUSTER_NODES="$NODES" WARREN_CLUSTER_SECRET="$SECRET" \
            WARREN_CLUSTER_HOST=127.0.0.1 WARREN_CLUSTER_PORT=$(cluster_port $i) WARREN_NODE_PROCESSES=$PROCESSES \
            WARREN_AMQP_HOST=127.0.0.1 WARREN_AMQP_PORT=$((5671 + i)) \
            WARREN_METRICS_HOST=127.0.0.1 WARREN_METRICS_PORT=$((15691 + i)) \
            WARREN_DATA_DIR="$DIR/n$i/data" \
                nohup "$SERVER" > "$DIR/n$i/log" 2>&1 &
            echo $! > "$DIR/n$i/pid"
        done
        for i in 1 2 3; do
            for _ in $(seq 100); do
                (exec 3<>/dev/tcp/127.0.0.1/$((5671 + i))) 2>/dev/null && break
                sleep 0.1
            done
        done
        "$0" pids "$DIR"
        ;;
    pids)
        cat "$DIR"/n1/pid "$DIR"/n2/pid "$DIR"/n3/pid | paste -sd,
        ;;
    stop)
        for i in 1 2 3; do
            [ -f "$DIR/n$i/pid" ] && kill "$(cat "$DIR/n$i/pid")" 2>/dev/null || true
        done
        ;;
    *)
        sed -n 2,12p "$0"; exit 2 ;;
esac
