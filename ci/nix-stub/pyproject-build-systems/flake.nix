# Offline stand-in for build-system-pkgs (see ../nixpkgs/flake.nix): the build systems the
# flake's overrides resolve. A name missing here fails the evaluation, as a build system
# missing from build-system-pkgs would.
{
  outputs =
    { self }:
    {
      overlays.default =
        final: prev:
        builtins.listToAttrs (
          map (name: { inherit name; value = { pname = name; buildSystem = true; }; }) [
            "editables"
            "hatchling"
            "setuptools"
            "wheel"
          ]
        );
    };
}
