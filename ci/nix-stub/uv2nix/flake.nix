# Offline stand-in for uv2nix (see ../nixpkgs/flake.nix). It reads uv.lock for real: the
# overlay has one stub package per locked package (format "wheel" when the lock has a wheel,
# else "pyproject", the sdist build), so an override of a name that is not locked fails the evaluation.
{
  outputs =
    { self }:
    {
      lib.workspace.loadWorkspace =
        { workspaceRoot }:
        assert builtins.pathExists (workspaceRoot + "/uv.lock");
        assert builtins.pathExists (workspaceRoot + "/pyproject.toml");
        let
          lock = builtins.fromTOML (builtins.readFile (workspaceRoot + "/uv.lock"));
          mkPackage =
            attrs:
            attrs
            // {
              outPath = "/nix/store/stub-${attrs.pname}-${attrs.version}";
              overrideAttrs = f: mkPackage (attrs // f attrs // { overridden = true; });
            };
          fromLock =
            package:
            mkPackage {
              pname = package.name;
              version = package.version or "0";
              format = if (package.wheels or [ ]) != [ ] then "wheel" else "pyproject";
              src = if package.name == "cortex-recipes" then workspaceRoot else "locked";
              nativeBuildInputs = [ ];
              buildInputs = [ ];
            };
        in
        {
          mkPyprojectOverlay =
            { sourcePreference }:
            final: prev:
            builtins.listToAttrs (map (p: { name = p.name; value = fromLock p; }) lock.package);
          mkEditablePyprojectOverlay =
            { root }:
            final: prev: {
              cortex-recipes = prev.cortex-recipes.overrideAttrs (old: { editableRoot = root; });
            };
        };
    };
}
