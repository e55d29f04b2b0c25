# Offline stand-in for nixpkgs: just enough structure for `ci/nix_check.py` to evaluate the
# project's flake and check what each dev shell asks for. Never used to build anything.
{
  outputs =
    { self }:
    let
      pkgs = {
        python311 = "python311";
        uv = "uv";
        git = "git";
        procps = "procps";
        callPackage = f: args: f args;
        mkShell = attrs: attrs // { stub = "mkShell"; };
      };
    in
    {
      lib = {
        unique = builtins.foldl' (acc: x: if builtins.elem x acc then acc else acc ++ [ x ]) [ ];
        composeManyExtensions = extensions: extensions;
      };
      legacyPackages = {
        x86_64-linux = pkgs;
        aarch64-linux = pkgs;
      };
    };
}
