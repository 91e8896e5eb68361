#!/bin/sh
# Build Open MPI from Debian's source tarball with CUDA support and pack it as one .deb.
#
#   build-openmpi-cuda.sh ORIG_TARBALL SHA256 CUDA_HOME PREFIX PACKAGE VERSION OUT_DIR [CONFIGURE_ARG...]
#
# CUDA_HOME may be a colon-separated list: the first folder holding include/cuda.h is used.
# ORIG_TARBALL is the upstream source Debian ships (openmpi_<v>.orig.tar.xz, checked against
# SHA256, the value Debian's signed .dsc lists). It is configured with Debian's choices for amd64
# (slurm, IPv6, C++ bindings) plus --with-cuda, installed under PREFIX (beside the distribution's
# Open MPI, which other packages depend on), and packed by dpkg-deb into
# OUT_DIR/PACKAGE_VERSION_ARCH.deb with the Depends read from the libraries the build links
# (dpkg -S of each). Debian's patches are not applied: they touch the autotools inputs for hppa,
# ia64, the Hurd and Debian's own library layout, none of which a prefix build on amd64 uses, and
# applying them would need autoreconf on the build host. The CUDA driver library is loaded at run
# time, never linked, so the package does not depend on a driver package.
#
# Prints one line at the end: `built OUT_DIR/<file>.deb`. Exits non-zero naming the step that failed.
set -eu

[ $# -ge 7 ] || { echo "usage: $0 ORIG_TARBALL SHA256 CUDA_HOME PREFIX PACKAGE VERSION OUT_DIR [CONFIGURE_ARG...]" >&2; exit 2; }
orig=$1 sha=$2 homes=$3 prefix=$4 package=$5 version=$6 out=$7
shift 7

fail() { echo "build-openmpi-cuda: $*" >&2; exit 1; }
cuda=""
for home in $(echo "$homes" | tr ':' ' '); do
  [ -f "$home/include/cuda.h" ] && { cuda=$home; break; }
done
[ -n "$cuda" ] || fail "no include/cuda.h under $homes: install the CUDA toolkit or set mpi_cuda_home"
echo "$sha  $orig" | sha256sum -c --quiet - || fail "$orig does not match sha256 $sha"
tools="cc c++ make dpkg-deb dpkg"
case "$orig" in *.xz) tools="$tools xz" ;; *.bz2) tools="$tools bzip2" ;; esac
for tool in $tools; do
  command -v "$tool" >/dev/null || fail "$tool is not installed on the build host"
done

work=$(mktemp -d /tmp/gpuenv-ompi-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xf "$orig" || fail "cannot unpack $orig"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'openmpi-*' | head -n 1)
[ -n "$src" ] || fail "$orig holds no openmpi-* folder"
major=$(basename "$src" | sed 's/^openmpi-\([0-9]*\).*/\1/')

# Open MPI 4 loads libcuda.so.1 itself; Open MPI 5's CUDA component links it, so it links the
# toolkit's stub (the real library comes with the driver at run time).
cuda_lib=""
if [ "$major" -ge 5 ]; then
  for dir in "$cuda/lib64/stubs" "$cuda/lib/stubs" "$cuda/targets/x86_64-linux/lib/stubs"; do
    [ -f "$dir/libcuda.so" ] && { cuda_lib="--with-cuda-libdir=$dir"; break; }
  done
  [ -n "$cuda_lib" ] || fail "no stubs/libcuda.so under $cuda for Open MPI $major"
  launch_prefix=--enable-prte-prefix-by-default
else
  launch_prefix=--enable-orterun-prefix-by-default
fi

jobs=$(nproc 2>/dev/null || echo 2)
log=$work/build.log
echo "configure (log: $log)"
(cd "$src" && ./configure --prefix="$prefix" --with-cuda="$cuda" ${cuda_lib:+"$cuda_lib"} "$launch_prefix" \
  --with-package-string="gpuenv CUDA-aware Open MPI (Debian source $version)" \
  --with-slurm --enable-ipv6 --disable-mpi-fortran --disable-static --without-ucx \
  "$@") >"$log" 2>&1 || { tail -n 40 "$log" >&2; fail "configure failed"; }
echo "make -j$jobs"
(cd "$src" && make -j"$jobs") >>"$log" 2>&1 || { tail -n 40 "$log" >&2; fail "make failed"; }
root=$work/root
(cd "$src" && make install DESTDIR="$root") >>"$log" 2>&1 || { tail -n 40 "$log" >&2; fail "make install failed"; }

# Depends: the packages owning the libraries the build links, outside its own tree and the driver.
# The staged tree's libraries resolve first (its RUNPATH, the prefix, does not exist yet here, and
# the distribution's Open MPI of the same soname must not be taken for them).
depends() {  # depends ROOT PREFIX
  find "$1$2" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c \
    'for f; do [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] && ldd "$f" 2>/dev/null; done; true' sh {} + |
    sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p' | grep -v -e "^$1/" -e "^$2/" -e 'libcuda\.so' | sort -u |
    while read -r lib; do
      dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
    done | grep -v '^diversion' | sed 's/:.*//' | tr ',' '\n' | sed 's/^ *//' | sort -u |
    paste -sd, - | sed 's/,/, /g'
}
deps=$(LD_LIBRARY_PATH="$root$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" depends "$root" "$prefix")
case "$deps" in *libopenmpi*) fail "the build links the distribution's Open MPI ($deps)" ;; esac
arch=$(dpkg --print-architecture)
size=$(du -sk "$root" | cut -f1)
mkdir -p "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<EOF
Package: $package
Version: $version
Architecture: $arch
Maintainer: gpuenv <gpuenv@localhost>
Installed-Size: $size
Depends: ${deps:-libc6}
Section: libs
Priority: optional
Description: Open MPI built with CUDA support (gpuenv)
 Open MPI from Debian's source tarball, configured with --with-cuda=$cuda and
 installed under $prefix, so MPI calls take CUDA device buffers.
EOF
mkdir -p "$out"
deb=$out/${package}_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null || fail "dpkg-deb failed"
echo "built $deb"
