#!/usr/bin/env bash
# Run conduit side by side with the peer schedulers (../shared/peers) in one interleaved run.
#   bash bench/run_peers.sh                       # conduit + APScheduler + Procrastinate, 3 rounds
#   ONLY='.' bash bench/run_peers.sh              # every peer bench too (about 20 minutes)
#   ROUNDS=1 bash bench/run_peers.sh
# Results land in /tmp/conduit-peers/results/ (the shared folder is read-only).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS_SRC="${PEERS_SRC:-$ROOT/../shared/peers}"
WORK="${PEERS_WORK:-/tmp/conduit-peers}"
mkdir -p "$WORK"
cp -r "$PEERS_SRC"/. "$WORK"/
chmod -R u+w "$WORK"
if [[ ! -x $WORK/.venv/bin/python ]]; then
  python3 -m venv "$WORK/.venv"
  "$WORK/.venv/bin/pip" install -q -r "$WORK/requirements.txt"
fi
cat > "$WORK/conduit-benches.txt" <<LINES
conduit-sqlite|$ROOT/.venv/bin/python $ROOT/bench/conduit_peer.py 2000 --store sqlite
conduit-postgres|$ROOT/.venv/bin/python $ROOT/bench/conduit_peer.py 2000 --store postgres
LINES
cd "$WORK"
ONLY="${ONLY:-^(aps-(sqlite|postgres)|procrastinate-postgres|conduit-.*)$}" \
  EXTRA_BENCHES="$WORK/conduit-benches.txt" REF="${REF:-aps-postgres}" bash run_all.sh
