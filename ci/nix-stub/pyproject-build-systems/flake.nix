# Offline stand-in for build-system-pkgs (see ../nixpkgs/flake.nix).
{
  outputs = { self }: { overlays.default = "build-systems overlay"; };
}
