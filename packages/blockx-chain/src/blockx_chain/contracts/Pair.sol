// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

interface IToken {
    function balanceOf(address owner) external view returns (uint256);
    function transfer(address to, uint256 value) external returns (bool);
    function transferFrom(address from, address to, uint256 value) external returns (bool);
}

/// The constant-product price, run by the pair through DELEGATECALL (it reads no
/// storage, so it runs the same in the pair's context). Payable, because a
/// DELEGATECALL carries the swap's msg.value along.
contract Quoter {
    function amountOut(uint256 amountIn, uint256 reserveIn, uint256 reserveOut)
        external
        payable
        returns (uint256)
    {
        uint256 withFee = amountIn * 997;
        return (withFee * reserveOut) / (reserveIn * 1000 + withFee);
    }
}

/// A contract the pair makes (CREATE and CREATE2) to exercise every kind of call
/// frame: it takes ETH, fails on request, and destroys itself.
contract Probe {
    receive() external payable {}

    function fail() external pure {
        revert("probe failed");
    }

    function close(address payable to) external {
        selfdestruct(to);
    }
}

/// A Uniswap-V2-shaped pair of a test token and ETH: `Swap` and `Sync` with V2's
/// signatures (token0 is the token, token1 is ETH). Prices come from the Quoter
/// through DELEGATECALL; balances through STATICCALL; tokens move with CALLs, and
/// ETH leaves the pair through CALLs with value.
contract Pair {
    address public immutable token;
    address public immutable quoter;
    uint112 public reserve0;
    uint112 public reserve1;
    uint256 public probes;

    event Swap(
        address indexed sender,
        uint256 amount0In,
        uint256 amount1In,
        uint256 amount0Out,
        uint256 amount1Out,
        address indexed to
    );
    event Sync(uint112 reserve0, uint112 reserve1);

    constructor(address token_) payable {
        token = token_;
        quoter = address(new Quoter());
    }

    /// Take the token and ETH sent to the pair as its reserves.
    function sync() external payable {
        _update();
    }

    function swapEthForTokens(address to) external payable returns (uint256 out) {
        out = _quote(msg.value, reserve1, reserve0);
        require(IToken(token).transfer(to, out), "transfer");
        _update();
        emit Swap(msg.sender, 0, msg.value, out, 0, to);
    }

    function swapTokensForEth(uint256 amountIn, address payable to) external returns (uint256 out) {
        out = _quote(amountIn, reserve0, reserve1);
        require(IToken(token).transferFrom(msg.sender, address(this), amountIn), "transferFrom");
        (bool sent,) = to.call{value: out}("");
        require(sent, "eth");
        _update();
        emit Swap(msg.sender, amountIn, 0, 0, out, to);
    }

    /// One frame of every kind: two creations (CREATE, CREATE2), ETH sent to each,
    /// an inner call that reverts (caught), and both probes destroyed, their ETH
    /// back to the caller.
    function probe() external payable {
        uint256 salt = ++probes;
        Probe made = new Probe();
        Probe salted = new Probe{salt: bytes32(salt)}();
        uint256 half = msg.value / 2;
        (bool sent,) = address(made).call{value: half}("");
        (bool sentSalted,) = address(salted).call{value: msg.value - half}("");
        require(sent && sentSalted, "eth");
        try made.fail() {} catch {}
        made.close(payable(msg.sender));
        salted.close(payable(msg.sender));
    }

    function _quote(uint256 amountIn, uint256 reserveIn, uint256 reserveOut)
        private
        returns (uint256)
    {
        (bool ok, bytes memory answer) = quoter.delegatecall(
            abi.encodeCall(Quoter.amountOut, (amountIn, reserveIn, reserveOut))
        );
        require(ok, "quote");
        return abi.decode(answer, (uint256));
    }

    function _update() private {
        uint256 balance0 = IToken(token).balanceOf(address(this));
        uint256 balance1 = address(this).balance;
        reserve0 = uint112(balance0);
        reserve1 = uint112(balance1);
        emit Sync(reserve0, reserve1);
    }
}
