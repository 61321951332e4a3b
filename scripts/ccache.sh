# Sourced by the build scripts: sets `launcher` to CMake's compiler-launcher arguments.
# ccache makes rebuilds fast; the sloppiness settings let it cache translation units that
# use the precompiled header. The base directory (the checkout) and the build's
# -ffile-prefix-map of it let a clone at another path (CI's) hit what this checkout
# compiled; the units that use gcc's precompiled header are keyed on a checksum of what it
# means rather than on its bytes, which differ between two compilations of the same header
# (scripts/ccache_launcher.sh writes the checksum; docs/reliability.md, "CI", measures it).
# The cache lives outside the checkout, beside the Python environment
# (scripts/python_env.sh), and holds both LibTorchs' builds.
launcher=()
if command -v ccache >/dev/null; then
  # The settings go into the launcher, not this shell's environment: a build run by hand
  # (`ninja -C build`) then fills the same cache as the scripts do, which is what a clone
  # hits (before, such builds went to ccache's default cache, and a clone of a commit built
  # that way missed: its wheel build took 525 s).
  ccache_settings=(
    "CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/stowage/ccache}"
    "CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-16G}"
    CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime,pch_external_checksum
    "CCACHE_BASEDIR=$root"
  )
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;$(IFS=';' && echo "${ccache_settings[*]}");$root/scripts/ccache_launcher.sh")
fi
