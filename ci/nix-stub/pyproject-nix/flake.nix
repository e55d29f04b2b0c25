# Offline stand-in for pyproject.nix (see ../nixpkgs/flake.nix).
{
  outputs =
    { self }:
    {
      build.packages =
        { python }:
        {
          overrideScope = extensions: {
            mkVirtualEnv = name: deps: {
              inherit name deps python extensions;
            };
          };
        };
    };
}
