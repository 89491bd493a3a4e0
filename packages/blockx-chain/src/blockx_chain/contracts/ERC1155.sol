// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

interface ERC1155Receiver {
    function onERC1155Received(address, address, uint256, uint256, bytes calldata)
        external
        returns (bytes4);

    function onERC1155BatchReceived(
        address,
        address,
        uint256[] calldata,
        uint256[] calldata,
        bytes calldata
    ) external returns (bytes4);
}

/// A minimal ERC-1155 for tests and the devnet: the deployer mints, a holder (or an
/// operator it approved) moves amounts of one id or of several at once. A contract
/// receiving tokens must accept them, as the standard asks.
contract TestMultiToken {
    address public immutable minter;

    mapping(uint256 => mapping(address => uint256)) private balances;
    mapping(address => mapping(address => bool)) public isApprovedForAll;

    event TransferSingle(
        address indexed operator,
        address indexed from,
        address indexed to,
        uint256 id,
        uint256 value
    );
    event TransferBatch(
        address indexed operator,
        address indexed from,
        address indexed to,
        uint256[] ids,
        uint256[] values
    );
    event ApprovalForAll(address indexed account, address indexed operator, bool approved);

    constructor() {
        minter = msg.sender;
    }

    function balanceOf(address account, uint256 id) external view returns (uint256) {
        return balances[id][account];
    }

    function mint(address to, uint256 id, uint256 value) external {
        require(msg.sender == minter, "minter");
        require(to != address(0), "to");
        balances[id][to] += value;
        emit TransferSingle(msg.sender, address(0), to, id, value);
        _acceptSingle(address(0), to, id, value, "");
    }

    function setApprovalForAll(address operator, bool approved) external {
        isApprovedForAll[msg.sender][operator] = approved;
        emit ApprovalForAll(msg.sender, operator, approved);
    }

    function safeTransferFrom(
        address from,
        address to,
        uint256 id,
        uint256 value,
        bytes calldata data
    ) external {
        _check(from, to);
        _move(from, to, id, value);
        emit TransferSingle(msg.sender, from, to, id, value);
        _acceptSingle(from, to, id, value, data);
    }

    function safeBatchTransferFrom(
        address from,
        address to,
        uint256[] calldata ids,
        uint256[] calldata values,
        bytes calldata data
    ) external {
        require(ids.length == values.length, "lengths");
        _check(from, to);
        for (uint256 i = 0; i < ids.length; i++) {
            _move(from, to, ids[i], values[i]);
        }
        emit TransferBatch(msg.sender, from, to, ids, values);
        if (to.code.length > 0) {
            bytes4 answer = ERC1155Receiver(to).onERC1155BatchReceived(
                msg.sender, from, ids, values, data
            );
            require(answer == ERC1155Receiver.onERC1155BatchReceived.selector, "refused");
        }
    }

    function _check(address from, address to) private view {
        require(to != address(0), "to");
        require(msg.sender == from || isApprovedForAll[from][msg.sender], "approval");
    }

    function _move(address from, address to, uint256 id, uint256 value) private {
        require(balances[id][from] >= value, "balance");
        balances[id][from] -= value;
        balances[id][to] += value;
    }

    function _acceptSingle(
        address from,
        address to,
        uint256 id,
        uint256 value,
        bytes memory data
    ) private {
        if (to.code.length > 0) {
            bytes4 answer = ERC1155Receiver(to).onERC1155Received(
                msg.sender, from, id, value, data
            );
            require(answer == ERC1155Receiver.onERC1155Received.selector, "refused");
        }
    }
}
