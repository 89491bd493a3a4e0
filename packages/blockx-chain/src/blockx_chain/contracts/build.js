// Compiles the devnet's contracts with solc-js (npm ci installs it) into JSON
// artifacts: the ABI and the creation bytecode, committed so Python-only steps
// need no compiler. Run from the repository root: `npm run build-contracts`.
// The solcjs command line has no EVM-version option (it defaults to a newer fork
// than the anvil devnet runs), so the standard-JSON API is used with cancun.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const here = __dirname;
// Source file, contract, artifact.
const builds = [
  ["ERC20.sol", "TestToken", "TestToken.json"],
  ["Pair.sol", "Pair", "Pair.json"],
];

for (const [file, name, out] of builds) {
  const input = {
    language: "Solidity",
    sources: { [file]: { content: fs.readFileSync(path.join(here, file), "utf8") } },
    settings: {
      evmVersion: "cancun",
      optimizer: { enabled: true, runs: 200 },
      outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input)));
  const errors = (output.errors || []).filter((e) => e.severity === "error");
  if (errors.length) {
    for (const e of errors) console.error(e.formattedMessage);
    process.exit(1);
  }
  const contract = output.contracts[file][name];
  const artifact = {
    contractName: name,
    compiler: `solc ${solc.version()}`,
    evmVersion: "cancun",
    abi: contract.abi,
    bytecode: "0x" + contract.evm.bytecode.object,
  };
  fs.writeFileSync(path.join(here, out), JSON.stringify(artifact, null, 2) + "\n");
  console.log(`${out}: ${artifact.bytecode.length / 2 - 1} bytes of bytecode`);
}
