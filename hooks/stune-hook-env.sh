# stune's hook environment: the preamble every shell hook in prolog/ and epilog/ sources (`.`), in one place.
# Not a hook and not executable: `stune-admin install` places it beside slurm.conf (in Slurm's configuration
# directory, which only root can write: the hooks' own trust) and points the hooks at it; a hook run from the
# source tree or the installed share/slurm-tune/ finds it at ../hooks/.
#
# It exports what /etc/default/stune (or $STUNE_ENV_FILE) sets, as `set -a; . FILE` does, but only when root
# alone can write that file and every directory above it (sshd's StrictModes; slurm_tune/safeio.py's rule
# for everything else root loads, and prolog/10-stune-health's in Python). Otherwise it says so in one line
# on stderr (the slurmd log) and exits the hook with 0: the hook does nothing, and a broken stune never
# drains a node. Then STUNE_BIN defaults to /opt/stune/bin. It replaces the hook's positional parameters
# (Slurm passes none).
STUNE_ENV_FILE=${STUNE_ENV_FILE:-/etc/default/stune}
if [ "$STUNE_ENV_FILE" != /dev/null ] && [ -r "$STUNE_ENV_FILE" ]; then
    p=$STUNE_ENV_FILE; set -- "$p"
    while [ "${p%/*}" != "$p" ]; do p=${p%/*}; [ -n "$p" ] && set -- "$@" "$p"; done
    untrusted='( ! -user 0 -o -perm /022 ! ( -type d -perm -1000 ) )'
    # shellcheck disable=SC2086  # $untrusted is split into find's expression on purpose
    if ! /usr/bin/find -H "$@" -maxdepth 0 $untrusted -exec false {} + 2>/dev/null; then
        echo "${0##*/}: $STUNE_ENV_FILE: not sourced: writable by someone other than root" \
             "($(/usr/bin/find -H "$@" -maxdepth 0 $untrusted -print 2>&1 | tr '\n' ' '))-" \
             "fix its owner/mode; nothing done" >&2
        exit 0
    fi
    set -a  # export everything the file sets (STUNE_*, SLURM_CONF, PATH)
    # shellcheck disable=SC1090
    . "$STUNE_ENV_FILE"
    set +a
fi
STUNE_BIN=${STUNE_BIN:-/opt/stune/bin}
# `stune_node_path PATH` sets $stune_path to PATH with %n as this node's Slurm name ($SLURMD_NODENAME, else the
# short host name) and %% as a literal %: the one %n rule (slurm_tune/thisnode.py's expand()) in sh, so a
# hook finds the directory the Python side (the sampler, stune-health) reads.
stune_node_path() {
    stune_rest=$1 stune_path=
    while :; do
        case $stune_rest in
            *%*) ;;
            *) stune_path=$stune_path$stune_rest; return 0 ;;
        esac
        stune_path=$stune_path${stune_rest%%\%*}
        stune_rest=${stune_rest#*%}
        case $stune_rest in
            n*) stune_node=$SLURMD_NODENAME
                [ -n "$stune_node" ] || { stune_node=$(uname -n); stune_node=${stune_node%%.*}; }
                stune_path=$stune_path$stune_node; stune_rest=${stune_rest#n} ;;
            %*) stune_path=$stune_path%; stune_rest=${stune_rest#%} ;;
            *) stune_path=$stune_path% ;;
        esac
    done
}
