"""The association tree and Slurm's fair-share formulas, as Slurm 22.05 computes them.

Two algorithms, chosen the way slurmctld chooses (PriorityFlags):

- Fair Tree (the default since 19.05): each association's LevelFS = S / U among its siblings, where S is its
  normalized shares and U its usage over its parent's usage. Siblings are sorted by LevelFS (users before
  accounts on a tie); a depth-first walk gives each user a rank, and FairShare = rank / number of user
  associations. Ties follow fair_tree.c exactly (tied users share a rank; an account tied with the
  previous sibling starts its children tied).
- Classic (PriorityFlags=NO_FAIR_TREE): FairShare = 2^(-(UE / S) / damping), with UE the effective usage
  UE = U_norm + (UE_parent - U_norm) * shares / level_shares, and S the product of shares fractions down
  the tree.

Fairshare=parent ("USE_PARENT") is handled as Slurm does: such an association is lifted into its first
ancestor that has real shares. DEPTH_OBLIVIOUS is not implemented (refused with a clear error).

Usage is per association as slurmctld keeps it: a user association's own charged usage; an account's is the
sum over its subtree. The math here is per association (thousands, not millions), so it is plain Python;
the per-job arithmetic that feeds it is vectorized elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import StuneError

USE_PARENT = None  # Fairshare=parent
NO_VAL = float(0xFFFFFFFE)  # Slurm's NO_VAL as the initial "previous LevelFS" in the Fair Tree walk
INF = float("inf")


class TreeError(StuneError):
    """The association tree cannot be used (unknown parent, unsupported flag ...)."""


@dataclass(frozen=True)
class Assoc:
    """One association. `user` is '' for an account association; `parent` is the parent account ('' for
    root); `shares` is the raw Fairshare, or None for Fairshare=parent."""

    account: str
    user: str = ""
    parent: str = ""
    shares: int | None = 1

    @property
    def is_user(self) -> bool:
        return bool(self.user)

    @property
    def key(self) -> tuple[str, str]:
        return (self.account, self.user)


@dataclass(frozen=True)
class ShareResult:
    """sshare-like numbers for every association, in tree order, and the user factors by (account, user)."""

    algorithm: str
    rows: tuple  # of ShareRowOut
    factors: dict = field(default_factory=dict)  # (account, user) -> FairShare factor

    def factor(self, account: str, user: str) -> float | None:
        return self.factors.get((account, user))


@dataclass(frozen=True)
class ShareRowOut:
    account: str
    user: str
    depth: int
    raw_shares: int | None
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    level_fs: float | None
    fairshare: float | None


class AssocTree:
    """Associations in Slurm's order (sacctmgr's lft order), with Slurm's parent links and level shares."""

    def __init__(self, assocs: list[Assoc]):
        if not assocs:
            raise TreeError("no associations")
        roots = [i for i, a in enumerate(assocs) if not a.is_user and a.account == "root"]
        if len(roots) != 1:
            raise TreeError("the association tree needs exactly one 'root' account")
        self.assocs = list(assocs)
        self.root = roots[0]
        self.index = {a.key: i for i, a in enumerate(self.assocs)}
        account_index = {a.account: i for i, a in enumerate(self.assocs) if not a.is_user}
        n = len(self.assocs)
        self.parent: list[int | None] = [None] * n
        for i, a in enumerate(self.assocs):
            if i == self.root:
                continue
            owner = a.account if a.is_user else a.parent
            if owner not in account_index:
                what = f"user {a.user} in account {a.account}" if a.is_user else f"account {a.account}"
                raise TreeError(f"{what}: parent account {owner!r} is not in the association tree")
            self.parent[i] = account_index[owner]
        if self.assocs[self.root].shares is USE_PARENT:
            raise TreeError("the root association cannot have Fairshare=parent")
        # fs parent: the first ancestor with real shares (Slurm's fs_assoc_ptr)
        self.fs_parent: list[int | None] = [None] * n
        for i in range(n):
            p = self.parent[i]
            while p is not None and self.assocs[p].shares is USE_PARENT:
                p = self.parent[p]
            self.fs_parent[i] = p
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(self.fs_parent):
            if p is not None:
                self.children[p].append(i)
        self.level_shares = [0] * n
        for i in range(n):
            total = self._children_level_shares(i)
            for c in self.children[i]:
                self.level_shares[c] = total
        self.depth = [0] * n
        for i in range(n):
            d, p = 0, self.parent[i]
            while p is not None:
                d, p = d + 1, self.parent[p]
            self.depth[i] = d
        self.user_indices = [i for i, a in enumerate(self.assocs) if a.is_user]

    def _children_level_shares(self, i: int) -> int:
        total = 0
        for c in self.children[i]:
            shares = self.assocs[c].shares
            total += self._children_level_shares(c) if shares is USE_PARENT else shares
        return total

    @classmethod
    def flat(cls, pairs) -> AssocTree:
        """A tree for what-if runs without sacctmgr: every account under root, every user under its account,
        all with Fairshare=1."""
        accounts: dict[str, list[str]] = {}
        for account, user in pairs:
            accounts.setdefault(account, [])
            if user and user not in accounts[account]:
                accounts[account].append(user)
        assocs = [Assoc("root")]
        for account in sorted(accounts):
            if account == "root":
                continue
            assocs.append(Assoc(account, parent="root"))
            assocs.extend(Assoc(account, user) for user in sorted(accounts[account]))
        assocs.extend(Assoc("root", user) for user in accounts.get("root", []))
        return cls(assocs)

    def share_holder(self, i: int) -> int:
        """The association whose shares `i` goes by: its fs parent for Fairshare=parent, else itself."""
        p = self.fs_parent[i]
        return p if self.assocs[i].shares is USE_PARENT and p is not None else i

    # ---- usage ------------------------------------------------------------------------------------------
    def raw_usage(self, user_usage: dict) -> list[float]:
        """usage_raw for every association: each user association's own usage, summed up the direct-parent
        chain as slurmctld does. Usage of associations not in the tree is ignored."""
        raw = [0.0] * len(self.assocs)
        for key, value in user_usage.items():
            i = self.index.get(key)
            if i is None or not self.assocs[i].is_user:
                continue
            while i is not None:
                raw[i] += value
                i = self.parent[i]
        return raw

    # ---- shares -----------------------------------------------------------------------------------------
    def norm_shares_fair_tree(self) -> list[float]:
        out = []
        for i in range(len(self.assocs)):
            fs = self.share_holder(i)
            level, shares = self.level_shares[fs], self.assocs[fs].shares
            out.append(shares / level if level and shares is not None else 0.0)
        return out

    def norm_shares_classic(self) -> list[float]:
        out: list[float | None] = [None] * len(self.assocs)

        def norm(i: int) -> float:
            known = out[i]
            if known is not None:
                return known
            a = self.assocs[i]
            if a.shares is USE_PARENT and (p := self.fs_parent[i]) is not None:
                value = norm(p)
            else:
                value, x = 1.0, i
                while (up := self.parent[x]) is not None:
                    shares = self.assocs[x].shares
                    if shares is not USE_PARENT:
                        if not self.level_shares[x]:
                            value = 0.0
                        else:
                            value *= shares / self.level_shares[x]
                    x = up
            out[i] = value
            return value

        return [norm(i) for i in range(len(self.assocs))]


def algorithm_from_flags(priority_flags: str) -> str:
    """'fair_tree' or 'classic', from scontrol's PriorityFlags (22.05: Fair Tree unless NO_FAIR_TREE)."""
    flags = {f.strip().upper() for f in (priority_flags or "").replace("(null)", "").split(",") if f.strip()}
    if "DEPTH_OBLIVIOUS" in flags:
        raise TreeError("PriorityFlags=DEPTH_OBLIVIOUS is not supported by stune's fair-share accountant")
    return "classic" if "NO_FAIR_TREE" in flags else "fair_tree"


def compute(
    tree: AssocTree, user_usage: dict, algorithm: str = "fair_tree", damping: float = 1.0
) -> ShareResult:
    """FairShare for every user association from per-(account, user) usage, by Slurm's algorithm."""
    if algorithm == "fair_tree":
        return _fair_tree(tree, user_usage)
    if algorithm == "classic":
        return _classic(tree, user_usage, damping)
    raise TreeError(f"unknown fair-share algorithm {algorithm!r}")


def _fair_tree(tree: AssocTree, user_usage: dict) -> ShareResult:
    raw = tree.raw_usage(user_usage)
    norm_shares = tree.norm_shares_fair_tree()
    n = len(tree.assocs)
    root_raw = raw[tree.root]
    efctv = [0.0] * n
    level_fs = [0.0] * n
    for i, a in enumerate(tree.assocs):
        p = tree.fs_parent[i]
        efctv[i] = raw[i] / raw[p] if p is not None and raw[p] else 0.0
        if a.shares is USE_PARENT:
            level_fs[i] = INF if a.is_user else NO_VAL
        elif norm_shares[i] == 0:
            level_fs[i] = 0.0
        else:
            level_fs[i] = norm_shares[i] / efctv[i] if efctv[i] else INF
    users = len(tree.user_indices)
    factors: dict = {}
    state = {"rank": users, "rnt": users}

    def walk(siblings: list[int], account_tied: bool) -> None:
        # Slurm sorts by LevelFS descending, users before accounts on a tie (glibc's qsort is a stable
        # merge sort for arrays this size, so input order breaks the remaining ties).
        order = sorted(siblings, key=lambda i: (-level_fs[i], 0 if tree.assocs[i].is_user else 1))
        prev = NO_VAL
        k = 0
        while k < len(order):
            i = order[k]
            tied = True if (k == 0 and account_tied) else (prev == level_fs[i])
            if tree.assocs[i].is_user:
                if not tied:
                    state["rank"] = state["rnt"]
                factors[tree.assocs[i].key] = state["rank"] / users if users else 0.0
                state["rnt"] -= 1
            else:
                merge = _count_tied_accounts(tree, order, k, level_fs)
                merged = [c for j in range(k, k + merge + 1) for c in tree.children[order[j]]]
                walk(merged, tied)
                k += merge
            prev = level_fs[i]
            k += 1

    walk(list(tree.children[tree.root]), False)
    rows = tuple(
        ShareRowOut(
            a.account,
            a.user,
            tree.depth[i],
            a.shares,
            norm_shares[i] if i != tree.root else 0.0,
            raw[i],
            min(raw[i] / root_raw, 1.0) if root_raw else 0.0,
            efctv[i] if i != tree.root else 1.0,
            None if i == tree.root else level_fs[i],
            factors.get(a.key) if a.is_user else None,
        )
        for i, a in enumerate(tree.assocs)
    )
    return ShareResult("fair_tree", rows, factors)


def _count_tied_accounts(tree: AssocTree, order: list[int], k: int, level_fs: list[float]) -> int:
    """fair_tree.c's count, kept literally: it stops at the first following account, so in practice tied
    accounts are not merged (each is walked on its own, starting tied)."""
    count = 0
    j = k + 1
    while j < len(order):
        if not tree.assocs[order[j]].is_user:
            break
        if level_fs[order[k]] != level_fs[order[j]]:
            break
        count += 1
        j += 1
    return count


def _classic(tree: AssocTree, user_usage: dict, damping: float) -> ShareResult:
    raw = tree.raw_usage(user_usage)
    norm_shares = tree.norm_shares_classic()
    n = len(tree.assocs)
    root_raw = raw[tree.root]
    usage_norm = [min(raw[i] / root_raw, 1.0) if root_raw else 0.0 for i in range(n)]
    efctv: list[float | None] = [None] * n

    def effective(i: int) -> float:
        known = efctv[i]
        if known is not None:
            return known
        a, p = tree.assocs[i], tree.fs_parent[i]
        if i == tree.root or p is None or p == tree.root:
            value = usage_norm[i]
        elif a.shares is USE_PARENT:
            value = effective(p)
        else:
            level = tree.level_shares[i]
            value = (
                effective(p)
                if not level
                else usage_norm[i] + (effective(p) - usage_norm[i]) * (a.shares / level)
            )
        efctv[i] = value
        return value

    factors = {}
    for i in tree.user_indices:
        fs = tree.share_holder(i)
        factors[tree.assocs[i].key] = classic_factor(effective(fs), norm_shares[fs], damping)
    rows = tuple(
        ShareRowOut(
            a.account,
            a.user,
            tree.depth[i],
            a.shares,
            norm_shares[i] if i != tree.root else 0.0,
            raw[i],
            usage_norm[i],
            effective(i) if i != tree.root else 1.0,
            None,
            factors.get(a.key) if a.is_user else None,
        )
        for i, a in enumerate(tree.assocs)
    )
    return ShareResult("classic", rows, factors)


def classic_factor(usage_efctv: float, shares_norm: float, damping: float = 1.0) -> float:
    """priority_p_calc_fs_factor: 2^(-(UE/S)/damping); 0 when the association has no shares."""
    if shares_norm <= 0:
        return 0.0
    return 2.0 ** (-((usage_efctv / shares_norm) / (damping or 1.0)))
