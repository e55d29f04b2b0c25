# Offline stand-in for uv2nix (see ../nixpkgs/flake.nix). It checks that the workspace has
# the files uv2nix reads.
{
  outputs =
    { self }:
    {
      lib.workspace.loadWorkspace =
        { workspaceRoot }:
        assert builtins.pathExists (workspaceRoot + "/uv.lock");
        assert builtins.pathExists (workspaceRoot + "/pyproject.toml");
        {
          mkPyprojectOverlay = { sourcePreference }: "uv.lock overlay (${sourcePreference})";
        };
    };
}
