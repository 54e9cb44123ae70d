# Helpers for .ci/setup/*.sh: install Debian packages once per CI run, quietly.
export DEBIAN_FRONTEND=noninteractive

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ ! -f /tmp/.runnerctl-apt-updated ]; then
        apt-get update -qq
        touch /tmp/.runnerctl-apt-updated
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
