#!/usr/bin/env bash
# Make Fashion-MNIST available offline, in the order zoo.data.fashion_mnist searches for it.
set -u
debian_dir=/usr/share/datasets/fashion-mnist
for d in "${ZOO_DATA_DIR:-}/fashion-mnist" ./data/fashion-mnist "$debian_dir"; do
  if [ -n "$d" ] && ls "$d"/train-images-idx3-ubyte* >/dev/null 2>&1; then
    echo "Fashion-MNIST found in $d"; exit 0
  fi
done
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "Installing Debian's dataset-fashion-mnist ..."
  (apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; }) \
    && ls "$debian_dir"/train-images-idx3-ubyte* >/dev/null 2>&1 && { echo "Fashion-MNIST installed in $debian_dir"; exit 0; }
fi
cat <<MSG
Fashion-MNIST was not found and could not be installed here. Either
  - put the four IDX files (plain or .gz) in \$ZOO_DATA_DIR/fashion-mnist or ./data/fashion-mnist, or
  - install Debian's package: sudo apt-get install dataset-fashion-mnist, or
  - go online: the data module then downloads it through torchvision.
MSG
exit 0
