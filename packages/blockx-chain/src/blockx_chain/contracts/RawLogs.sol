// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// Emits whatever log it is given, from its own address: for tests of logs that
/// look like a standard's event and break its layout, as any contract can emit.
contract RawLogs {
    function emitLog(bytes32[] calldata topics, bytes calldata data) external {
        require(topics.length <= 4, "topics");
        assembly {
            let p := mload(0x40)
            calldatacopy(p, data.offset, data.length)
            let n := data.length
            switch topics.length
            case 0 { log0(p, n) }
            case 1 { log1(p, n, calldataload(topics.offset)) }
            case 2 {
                log2(p, n, calldataload(topics.offset), calldataload(add(topics.offset, 32)))
            }
            case 3 {
                log3(
                    p,
                    n,
                    calldataload(topics.offset),
                    calldataload(add(topics.offset, 32)),
                    calldataload(add(topics.offset, 64))
                )
            }
            default {
                log4(
                    p,
                    n,
                    calldataload(topics.offset),
                    calldataload(add(topics.offset, 32)),
                    calldataload(add(topics.offset, 64)),
                    calldataload(add(topics.offset, 96))
                )
            }
        }
    }
}
