# A Debian base image from a root file system tarball made by mmdebstrap
# (deploy/image/build.sh), standing in for debian:bookworm-slim where no
# registry is reachable. The context is the directory holding rootfs.tar.
FROM scratch
ADD rootfs.tar /
CMD ["bash"]
