# Offline stand-in for nixpkgs: just enough structure for `ci/nix_check.py` to evaluate the
# project's flake and check what each dev shell asks for. Never used to build anything.
# `lib.composeManyExtensions` is the real composition (overlays apply in order), so the
# overrides in flake.nix are really applied to the stub package set.
{
  outputs =
    { self }:
    let
      stub = name: { pname = name; outPath = "/nix/store/stub-${name}"; };
      pkgs = {
        python311 = {
          pname = "python311";
          interpreter = "/nix/store/stub-python311/bin/python3.11";
          sitePackages = "lib/python3.11/site-packages";
        };
        uv = "uv";
        git = "git";
        procps = "procps";
        autoAddDriverRunpath = stub "autoAddDriverRunpath";
        rdma-core = stub "rdma-core";
        callPackage = f: args: f args;
        mkShell = attrs: attrs // { stub = "mkShell"; };
      };
    in
    {
      lib = {
        unique = builtins.foldl' (acc: x: if builtins.elem x acc then acc else acc ++ [ x ]) [ ];
        composeManyExtensions =
          extensions: final: prev:
          builtins.foldl' (applied: extension: applied // extension final (prev // applied)) { } extensions;
        concatMapStrings = f: list: builtins.concatStringsSep "" (map f list);
        concatStringsSep = builtins.concatStringsSep;
        fileset = {
          unions = files: files;
          toSource = { root, fileset }: { stub = "fileset"; files = map toString fileset; };
        };
      };
      legacyPackages = {
        x86_64-linux = pkgs;
        aarch64-linux = pkgs;
      };
    };
}
