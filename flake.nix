{
  description = "cortex-recipes: a development shell per journey, built from uv.lock";

  # Every input is pinned in flake.lock (rev + narHash); `ci/nix_check.py` fails on an
  # input that is not. Refresh with `nix flake update` on a networked machine.
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    pyproject-nix = {
      url = "github:pyproject-nix/pyproject.nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    uv2nix = {
      url = "github:pyproject-nix/uv2nix";
      inputs.nixpkgs.follows = "nixpkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
    };
    pyproject-build-systems = {
      url = "github:pyproject-nix/build-system-pkgs";
      inputs.nixpkgs.follows = "nixpkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.uv2nix.follows = "uv2nix";
    };
  };

  outputs =
    { self, nixpkgs, pyproject-nix, uv2nix, pyproject-build-systems }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; }) systems);

      # The one place that names the journeys, their extras and smoke commands.
      journeys = (builtins.fromTOML (builtins.readFile ./journeys.toml)).journey;

      workspace = uv2nix.lib.workspace.loadWorkspace { workspaceRoot = ./.; };
      overlay = workspace.mkPyprojectOverlay { sourcePreference = "wheel"; };

      shellsFor =
        system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
          python = pkgs.python311;
          pythonSet =
            (pkgs.callPackage pyproject-nix.build.packages { inherit python; }).overrideScope
              (nixpkgs.lib.composeManyExtensions [
                pyproject-build-systems.overlays.default
                overlay
              ]);
          # The tools the journey READMEs use besides Python.
          tools = [ pkgs.uv pkgs.git pkgs.procps ];
          envFor =
            name: extras:
            pythonSet.mkVirtualEnv "cortex-recipes-${name}" { cortex-recipes = extras; };
          shellFor =
            name: extras:
            pkgs.mkShell {
              packages = [ (envFor name extras) ] ++ tools;
              env = {
                UV_NO_SYNC = "1";
                UV_PYTHON_DOWNLOADS = "never";
                CORTEX_JOURNEY = name;
              };
              shellHook = ''
                export PYTHONPATH="$PWD''${PYTHONPATH:+:$PYTHONPATH}"
              '';
            };
          perJourney = builtins.listToAttrs (
            map (j: {
              name = j.name;
              value = shellFor j.name [ "local" j.extra "dev" ];
            }) journeys
          );
          allExtras = nixpkgs.lib.unique ([ "local" "dev" ] ++ map (j: j.extra) journeys);
        in
        perJourney // { default = shellFor "default" allExtras; };
    in
    {
      devShells = forSystems shellsFor;
      journeys = map (j: { inherit (j) name extra entry_point smoke; }) journeys;
    };
}
