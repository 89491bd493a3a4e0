// Compiles the devnet's contracts with solc-js (npm ci installs it) into one JSON
// artifact each: the ABI and the creation bytecode, committed so Python-only steps
// need no compiler. Run from the repository root: `npm run build-contracts`.
// The solcjs command line has no EVM-version option (it defaults to a newer fork
// than the anvil devnet runs), so the standard-JSON API is used with cancun.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const here = __dirname;
// [source file, contract name]: the artifact is <contract name>.json.
const CONTRACTS = [
  ["ERC20.sol", "TestToken"],
  ["ERC721.sol", "TestNFT"],
  ["ERC1155.sol", "TestMultiToken"],
  ["RawLogs.sol", "RawLogs"],
  ["Pair.sol", "Pair"],
];

const sources = {};
for (const [file] of CONTRACTS) {
  sources[file] = { content: fs.readFileSync(path.join(here, file), "utf8") };
}
const input = {
  language: "Solidity",
  sources,
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
for (const [file, name] of CONTRACTS) {
  const contract = output.contracts[file][name];
  const artifact = {
    contractName: name,
    compiler: `solc ${solc.version()}`,
    evmVersion: "cancun",
    abi: contract.abi,
    bytecode: "0x" + contract.evm.bytecode.object,
  };
  fs.writeFileSync(path.join(here, `${name}.json`), JSON.stringify(artifact, null, 2) + "\n");
  console.log(`${name}.json: ${artifact.bytecode.length / 2 - 1} bytes of bytecode`);
}
