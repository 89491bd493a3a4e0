// Compiles ERC20.sol with solc-js (npm ci installs it) into TestToken.json: the ABI
// and the creation bytecode, committed so Python-only steps need no compiler.
// Run from the repository root: `npm run build-contracts`.
// The solcjs command line has no EVM-version option (it defaults to a newer fork
// than the anvil devnet runs), so the standard-JSON API is used with cancun.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const here = __dirname;
const source = fs.readFileSync(path.join(here, "ERC20.sol"), "utf8");
const input = {
  language: "Solidity",
  sources: { "ERC20.sol": { content: source } },
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
const contract = output.contracts["ERC20.sol"].TestToken;
const artifact = {
  contractName: "TestToken",
  compiler: `solc ${solc.version()}`,
  evmVersion: "cancun",
  abi: contract.abi,
  bytecode: "0x" + contract.evm.bytecode.object,
};
fs.writeFileSync(path.join(here, "TestToken.json"), JSON.stringify(artifact, null, 2) + "\n");
console.log(`TestToken.json: ${artifact.bytecode.length / 2 - 1} bytes of bytecode`);
