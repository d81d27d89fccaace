# Sourced by the scripts that need a Debian package (`test.sh`, `wrk.sh`): `install PACKAGE
# COMMAND` installs PACKAGE with apt-get (as root, or through sudo) when COMMAND is missing.

# Installs the Debian package $1 when its command $2 is missing.
install() {
    local package=$1 command=$2
    if command -v "$command" >/dev/null 2>&1; then
        return 0
    fi
    echo "$command not found: installing $package with apt-get" >&2
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "error: no apt-get here; install $package yourself" >&2
        return 1
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "error: not root and no sudo; install $package yourself" >&2
            return 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    # A failing mirror need not stop the install: the package lists may already be there.
    ${sudo[@]+"${sudo[@]}"} apt-get update -q </dev/null || echo "warning: apt-get update failed" >&2
    ${sudo[@]+"${sudo[@]}"} apt-get install -y -q --no-install-recommends "$package" </dev/null
    if ! command -v "$command" >/dev/null 2>&1; then
        echo "error: $command is still not on PATH after apt-get install $package" >&2
        return 1
    fi
}
