//! qemu-img / qemu-io helpers: making test images and the reference raw conversion. In progress.
