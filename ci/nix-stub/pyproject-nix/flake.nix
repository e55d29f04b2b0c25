# Offline stand-in for pyproject.nix (see ../nixpkgs/flake.nix). `overrideScope` takes the
# fixed point of the composed overlays, as the real package set does; `mkVirtualEnv` returns
# what it was asked for plus a summary of every package an overlay changed.
{
  outputs =
    { self }:
    {
      build.packages =
        { python }:
        let
          base = final: {
            inherit python;
            resolveBuildSystem = spec: map (name: "build-system:${final.${name}.pname}") (builtins.attrNames spec);
            mkVirtualEnv = name: deps: {
              inherit name deps;
              python = python.pname;
              overridden = builtins.listToAttrs (
                map (pname: {
                  name = pname;
                  value = {
                    inherit (final.${pname}) format nativeBuildInputs buildInputs;
                    autoPatchelfIgnoreMissingDeps = final.${pname}.autoPatchelfIgnoreMissingDeps or [ ];
                    preFixup = final.${pname}.preFixup or "";
                    editableRoot = final.${pname}.editableRoot or null;
                    src = if builtins.isAttrs final.${pname}.src then final.${pname}.src else "locked";
                  };
                }) (builtins.filter (pname: final.${pname}.overridden or false) (builtins.attrNames final))
              );
            };
          };
        in
        {
          overrideScope =
            extension:
            let
              final = (base final) // extension final (base final);
            in
            final;
        };
    };
}
